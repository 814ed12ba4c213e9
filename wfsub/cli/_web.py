"""`wfsub web STORE`: the case inspector (`wfsub.contrib.web`) served over a `wfsub.Client` of the store.

The inspector runs in its own process beside the Substrate that owns the store: it reads what the owner recorded
and sends its actions through the store's inbox, as every other command does, so it never owns, never runs a case
and never takes over. It listens on 127.0.0.1 unless `--host` says otherwise, and says where it listens.

It answers only requests whose `Host` names the address it serves (127.0.0.1, localhost and [::1] with its port,
the `--host` given, and each `--allow-host`), so a web page whose own name an attacker points at this address
(DNS rebinding) reads nothing and acts on nothing.
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
import click

from .. import WfsubError
from ._commands import STORE, main
from ._targets import CliError, _store_for_cli, load_target, open_noting

DEFAULT_PORT = 8377


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


LOOPBACK = ("127.0.0.1", "localhost", "::1")
EVERY_INTERFACE = ("0.0.0.0", "::", "")


def _served_hosts(host: str, port: int) -> list[str]:
    """The `Host` names a request to this server may carry: the loopback names, and the address it listens on
    (an address of every interface names none: pass --allow-host for the names it is reached by), with its port."""
    names = [*LOOPBACK, *([] if host in EVERY_INTERFACE or host in LOOPBACK else [host])]
    return [f"{_url_host(name)}:{port}" for name in names]


@main.command()
@STORE
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The interface to listen on (0.0.0.0: every interface; the inspector can steer cases).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="The port to listen on (0: any free port, printed).")
@click.option("--workflow", "-w", "workflow", envvar="WFSUB_WORKFLOW", show_envvar=True, metavar="MODULE:ATTR",
              help="The dict of name -> workflow given to Substrate(workflows=), to draw the cases of versions "
                   "whose summary in the store keeps no drawing (one written by an older wfsub).")
@click.option("--read-only", is_flag=True, help="Show the cases, take no actions (no signal, no cancel).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME[:PORT]",
              help="Another host name the inspector is reached by (a request naming any other is refused).")
def web(store: str, host: str, port: int, workflow: str | None, read_only: bool, allow_hosts: tuple[str, ...]) -> None:
    """Serve the case inspector for STORE in the browser."""
    try:
        import uvicorn

        from ..contrib.web import app
    except ImportError as exc:
        raise CliError(
            f"wfsub web needs the web extra ({exc.name} is not installed): pip install 'wfsub[web]'"
        ) from exc
    workflows: dict[str, Any] | None = None
    if workflow is not None:
        loaded = load_target(workflow)
        if loaded.registry is None:
            raise CliError(
                f"{workflow} is one workflow term; --workflow needs the dict of name -> workflow given to "
                "Substrate(workflows=...), so that each case is drawn on the workflow its name says"
            )
        workflows = dict(loaded.registry)
    opened = _store_for_cli(store)

    async def serve() -> None:
        from .. import Client

        try:  # bound here, so that the address is known (port 0) and a taken port is an error before serving
            sock = socket.create_server((host, port))
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass another --port") from exc
        with sock:
            probe = _store_for_cli(store)  # reachable? (saying what it waits for while a database does not answer)
            await open_noting(probe)
            await probe.close()
            address = sock.getsockname()
            async with Client(opened) as client:
                hosts = [*_served_hosts(host, address[1]), *allow_hosts]
                try:
                    asgi = app(client, read_only=read_only, workflows=workflows, allowed_hosts=hosts)
                except ValueError as exc:  # an --allow-host that is not a host name
                    raise CliError(str(exc).replace("allowed_hosts", "--allow-host")) from exc
                server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="off"))
                where = f"http://{_url_host(address[0])}:{address[1]}/"
                scope = ("only this machine can reach it (--host 0.0.0.0 listens on every interface)"
                         if host in LOOPBACK else
                         f"anyone who reaches {host} can {'read' if read_only else 'read and steer'} these cases")
                if host in EVERY_INTERFACE and not allow_hosts:
                    scope += ("; it answers only requests for localhost: pass --allow-host NAME for each name or "
                              "address it is reached by")
                click.echo(f"wfsub web: the inspector of {store} at {where}; {scope}. Ctrl+C stops it.", err=True)
                await server.serve(sockets=[sock])

    try:
        anyio.run(serve)
    except KeyboardInterrupt:
        pass
    except WfsubError as exc:  # the store cannot be read (another schema, gone away)
        raise CliError(str(exc)) from exc
