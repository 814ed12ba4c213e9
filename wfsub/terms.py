"""The pattern algebra (`wfsub.terms`): the term constructors and `Retry` (`wfsub` re-exports them), and the
tree helpers tools walk a term with (`children`, `child_path`, `branch_name`)."""

from ._terms import Retry as Retry
from ._terms import Term as Term
from ._terms import add_instances as add_instances
from ._terms import branch_name as branch_name
from ._terms import call as call
from ._terms import cancel_region as cancel_region
from ._terms import child_path as child_path
from ._terms import children as children
from ._terms import close_instances as close_instances
from ._terms import complete_region as complete_region
from ._terms import critical as critical
from ._terms import defer as defer
from ._terms import effect as effect
from ._terms import interleave as interleave
from ._terms import loop as loop
from ._terms import mi as mi
from ._terms import milestone as milestone
from ._terms import multi_choice as multi_choice
from ._terms import net as net
from ._terms import par as par
from ._terms import reply as reply
from ._terms import saga as saga
from ._terms import scope as scope
from ._terms import seq as seq
from ._terms import signal_case as signal_case
from ._terms import sleep as sleep
from ._terms import start_case as start_case
from ._terms import task as task
from ._terms import terminate as terminate
from ._terms import wait as wait
from ._terms import when_milestone as when_milestone
from ._terms import xor as xor

__all__ = [
    "Retry",
    "Term",
    "add_instances",
    "branch_name",
    "call",
    "cancel_region",
    "child_path",
    "children",
    "close_instances",
    "complete_region",
    "critical",
    "defer",
    "effect",
    "interleave",
    "loop",
    "mi",
    "milestone",
    "multi_choice",
    "net",
    "par",
    "reply",
    "saga",
    "scope",
    "seq",
    "signal_case",
    "sleep",
    "start_case",
    "task",
    "terminate",
    "wait",
    "when_milestone",
    "xor",
]
