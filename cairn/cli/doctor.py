"""``cairn doctor``: the host checked as cairnd sees it, plus what only the caller can
check (credential stores as root, linger, the providers' answers), and each run's journal
cross-checked with its snapshots, units and receipts. Added to the main app by
:mod:`cairn.cli.runs`."""


import os
from typing import TYPE_CHECKING

import click

from cairn.cli.client import emit, fail, list_or_empty, object_or_empty, request, typed
from cairn.cli.completion import run_candidates
from cairn.cli.options import (
    argument,
    check_run_ref,
    completes,
    json_flag,
    value_check,
)
from cairn.errors import Unavailable
from cairn.protocol.requestchecks import RUN_REF_HELP
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.hostcheck import HostCheck
    from cairn.protocol.jsonvalue import JSONObject


@argument(
    "run_id",
    metavar="[RUN]",
    help=RUN_REF_HELP + " Without it, every run you may see.",
    callback=value_check(check_run_ref),
    shell_complete=completes(run_candidates),
    required=False,
)
@click.option(
    "--providers",
    help="Also ask each model provider for one short answer, as "
        "'cairn provider test' does (root).",
    is_flag=True,
)
@json_flag
def doctor(
    run_id: str | None = None,
    providers: bool = False,
    json_out: bool = False,
) -> None:
    """Check the host (sockets, pool, free space, release, config, providers, credentials,
    linger) and cross-check each run's journal, snapshots, units and receipts; exit 1 on
    any failure. With RUN, only that run.

    Example: sudo cairn doctor --providers
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.hostcheck import HostCheck
    from cairn.protocol.daemon import DoctorRequest
    from cairn.protocol.view_replies import DoctorReply

    if providers and run_id:
        fail("--providers checks the host, not a run", hint="leave out RUN", code=2)
    data = request(DoctorRequest(run_id=run_id)) if run_id else host_doctor(providers)
    # cairnd's report (without RUN, with the checks only the caller can make added)
    report = typed(DoctorReply, data)
    if json_out:
        emit(data)
    else:
        for check in report.host:
            click.echo(printable(HostCheck.model_validate(check.model_dump()).line()))
        for run in report.runs:
            mark = "ok" if not run.problems else f"{len(run.problems)} problem(s)"
            click.echo(f"{run.run_id}  {run.state:<10} {mark}")
            for problem in run.problems:
                click.echo(f"  - {printable(problem)}")
            for warning in run.warnings:
                click.echo(f"  warning: {printable(warning)}")
            for note in run.notes:
                click.echo(f"  note: {printable(note)}")
            if run.applied:
                counts = run.applied
                click.echo(
                    f"  live project: {counts.as_applied} path(s) as applied, "
                    f"{counts.reverted} reverted, {counts.changed} changed since"
                )
    if report.problems:
        raise click.exceptions.Exit(1)


def host_doctor(providers: bool = False) -> "JSONObject":
    """cairnd's report with the checks only the caller can make added: the credential
    stores (as root), the caller's linger and, with ``providers``, one answer of each
    provider (as root). Without cairnd, say so, as a failed check."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.hostcheck import HostCheck, credential_checks, credential_stores, linger_check
    from cairn.protocol.daemon import DoctorRequest, ScheduleListRequest
    from cairn.protocol.view_replies import DoctorReply

    try:
        sent = request(DoctorRequest())
    except Unavailable as exc:
        down = HostCheck(check="cairnd", status="fail", detail=exc.message,
                         fix="sudo systemctl enable --now cairn.socket")
        return {"host": [down.model_dump()], "credentials": {}, "runs": [], "problems": 1}
    reply = typed(DoctorReply, sent)
    views = list_or_empty(request(ScheduleListRequest()))
    schedules = sum(1 for view in views if object_or_empty(view).get("timer"))
    local = [
        *credential_checks(reply.credentials, credential_stores()),
        linger_check(schedules),
        *(provider_answers() if providers else []),
    ]
    # cairnd's report as sent (a key a newer cairnd adds is passed on), the local checks added
    return {
        **object_or_empty(sent),
        "host": [*(c.model_dump() for c in reply.host), *(c.model_dump() for c in local)],
        "problems": reply.problems + sum(1 for c in local if c.status == "fail"),
    }


def provider_answers() -> list["HostCheck"]:
    """``HostCheck``s, one a provider: its answer to one short request through the model
    relay (:func:`cairn.provider_setup.probe_provider`), as root; a warning otherwise."""
    from cairn.config import Problems
    from cairn.hostcheck import HostCheck
    from cairn.provider_setup import probe_provider
    from cairn.providers import load_providers

    if os.geteuid() != 0:
        return [HostCheck(check="provider answers", status="warn",
                          detail="not asked: only root may use the providers' keys",
                          fix="sudo cairn doctor --providers")]
    checks = []
    for name in sorted(load_providers(problems=Problems()).providers):
        answered, line = probe_provider(name)
        checks.append(HostCheck(
            check=f"answer of {name}", status="ok" if answered else "fail", detail=line,
            fix="" if answered else "see cairn-providers.toml(5); then sudo cairn provider "
            f"test {name}"))
    return checks
