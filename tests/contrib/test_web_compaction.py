"""The web inspector's timeline shows a compacted journal's snapshot record as what it is, never its machine state."""

from __future__ import annotations

from wfsub import JournalRecord
from wfsub.contrib.web import _view


def test_a_snapshot_record_is_shown_as_a_compaction_with_its_start_data_redacted() -> None:
    """The entry says the records before it were compacted, names the version, and shows only the (redacted)
    start data: the snapshot's machine state (which holds the case data unredacted) is not shown."""
    record = JournalRecord.model_validate({
        "seq": 1001, "kind": "snapshot", "step": 5000, "time": 1_800_000_000.0, "digest": None,
        "start": {"seq": 0, "kind": "start", "data": {"card": "4111"}}, "fingerprint": "abcdef0123456789",
        "format": 1, "bytecode": 1, "state": {"machine": {"secret": "4111"}},
    })
    entry = _view._entry(record, lambda value: {"card": "[hidden]"} if isinstance(value, dict) else value)
    assert "compacted" in entry.title and "seq 1001" in entry.title and "abcdef012345" in entry.title
    assert "[hidden]" in entry.detail and "4111" not in entry.detail and "machine" not in entry.detail
