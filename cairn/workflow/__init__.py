"""What a workflow module imports: ``from cairn.workflow import agent, workflow, Field, Model``.

Nothing here has an effect. A workflow reaches the outside only through the ``flow``
object the runtime passes as the first argument of its ``@workflow`` function; static
review (:mod:`cairn.workflow.review`) checks that the source keeps to that rule.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from pydantic import BaseModel, Field

from cairn.errors import UsageError
from cairn.netpolicy import NETWORK_MODES, NetworkMode
from cairn.workflow.schema import MODEL_CONFIG

__all__ = [
    "RUNTIME_API_VERSION",
    "AgentDescriptor",
    "Field",
    "Model",
    "OperationFailed",
    "WorkflowSpec",
    "agent",
    "workflow",
]

RUNTIME_API_VERSION = "cairn.workflow/1"

Access = Literal["read", "write"]
Network = NetworkMode  # the modes and allowlist rules live in cairn.netpolicy
ACCESS_MODES: tuple[Access, ...] = ("read", "write")


class Model(BaseModel):
    """Base of every typed value in a workflow: closed (extra fields refused) and frozen."""

    model_config = MODEL_CONFIG


class OperationFailed(Exception):  # noqa: N818 - named for what workflow code catches
    """Raised into workflow code when a ``flow.*`` operation settles as a failure.

    It derives from ``Exception``, so ``except OperationFailed`` (or ``except Exception``)
    may handle it; the runtime's suspend and cancel signals derive from ``BaseException``
    and pass through.
    """

    def __init__(self, message: str, *, kind: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class AgentDescriptor:
    """A reviewed agent: which profile runs, with what access and network, producing what."""

    profile: str
    access: Access
    network: Network
    output: type[Model]
    allowlist: tuple[str, ...]


@dataclass(frozen=True)
class WorkflowSpec:
    """What ``@workflow`` records on the function (attribute ``__cairn_workflow__``)."""

    function: str
    description: str
    input: type[Model]
    output: type[Model]
    write_paths: tuple[str, ...] | None = None


WorkflowFunction = Callable[..., Coroutine[object, object, object]]
F = TypeVar("F", bound=WorkflowFunction)


def agent(
    *,
    profile: str,
    access: Access = "read",
    network: Network = "none",
    output: type[Model],
    allowlist: tuple[str, ...] = (),
) -> AgentDescriptor:
    """Declare an agent; the declaration itself starts nothing."""
    if access not in ACCESS_MODES:
        raise UsageError(f"agent access must be one of {', '.join(ACCESS_MODES)}, not {access!r}")
    if network not in NETWORK_MODES:
        raise UsageError(
            f"agent network must be one of {', '.join(NETWORK_MODES)}, not {network!r}"
        )
    if not (isinstance(output, type) and issubclass(output, Model)):
        raise UsageError("agent output= must be a Model class of the workflow module")
    return AgentDescriptor(
        profile=profile,
        access=access,
        network=network,
        output=output,
        allowlist=tuple(allowlist),
    )


def workflow(
    *,
    description: str,
    input: type[Model],
    output: type[Model],
    write_paths: Sequence[str] | None = None,
) -> Callable[[F], F]:
    """Mark the module's one workflow function; records a :class:`WorkflowSpec` on it.
    ``write_paths``: the project globs its proposal may change (the review checks them;
    settlement refuses any other path)."""

    def mark(function: F) -> F:
        spec = WorkflowSpec(
            function=function.__name__,
            description=description,
            input=input,
            output=output,
            write_paths=None if write_paths is None else tuple(write_paths),
        )
        setattr(function, "__cairn_workflow__", spec)  # noqa: B010 - attribute on a callable
        return function

    return mark
