"""Optional tools built on wfsub's public terms and trace events.

- `wfsub.contrib.diagram`: `to_mermaid(term)` and `to_dot(term)` draw a workflow (re-exported by `wfsub`).
- `wfsub.contrib.otel`: `OTelSink`, a trace sink that turns a case's events into OpenTelemetry spans; it needs
  the `otel` extra (`pip install 'wfsub[otel]'`) and is never imported by `import wfsub`.

This package imports none of its modules itself, so importing one never loads another's dependencies.
"""
