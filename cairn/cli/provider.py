"""``cairn provider``: the model providers of this host. ``add`` and ``rm`` edit
``/etc/cairn/providers.toml`` and the encrypted key (root; :mod:`cairn.provider_setup`),
``list`` reads the file as the caller, ``test`` asks the provider once through the model
relay a run uses (root; :mod:`cairn.coordinator.probe`)."""


import getpass
import os
import sys

import click

from cairn.cli.client import emit, fail
from cairn.cli.options import (
    CairnGroup,
    argument,
    columns,
    confirm_or_stop,
    dry_run_flag,
    echo,
    hidden_alias,
    json_flag,
    would,
    yes_flag,
)

provider_app = CairnGroup(
    "provider",
    help="Model providers of this host: where llm agents' requests go, and their keys.",
    no_args_is_help=True,
)

name_argument = argument("name", metavar="NAME", help="The provider's name, e.g. openai.")
WRITES = "it writes /etc/cairn and the host's credentials"


def _need_root(what: str, why: str) -> None:
    if os.geteuid() != 0:
        fail(f"provider {what} needs root: {why}",
             hint=f"run it with sudo: sudo cairn provider {what} …", code=2)


def _read_key(name: str, from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline()
    if not sys.stdin.isatty():
        fail("no key given and no terminal to ask for one",
             hint="pipe it in with --key-from-stdin, or say --no-key for a provider that "
             "takes none", code=2)
    return getpass.getpass(f"API key for {name} (not shown): ")


@provider_app.command("add")
@name_argument
@click.option(
    "--base-url",
    help="The API's base URL, e.g. https://api.openai.com/v1 or "
        "http://127.0.0.1:8080/v1 for a local server.",
    required=True,
)
@click.option("--model", help="The model every request of this provider uses.", required=True)
@click.option("--api", help="The API it speaks: openai or anthropic.", default="openai")
@click.option(
    "--key-from-stdin",
    help="Read the key from standard input (one line).",
    is_flag=True,
)
@click.option(
    "--no-key",
    help="The provider takes no key (a local server).",
    is_flag=True,
)
@click.option(
    "--default",
    help="Make it the provider of profiles that name none (the first "
        "provider added becomes the default anyway).",
    is_flag=True,
)
@click.option(
    "--max-tokens-per-call",
    type=int,
    help="Upper bound of tokens one model call may ask for.",
    default=8192,
)
@click.option("--timeout", type=float, help="Seconds one model call may take.", default=300.0)
@click.option(
    "--prices",
    type=(float, float),
    metavar="INPUT OUTPUT",
    help="What a million input and output tokens cost (in the one currency of all the "
        "host's prices), for money budgets.",
)
def provider_add(
    name: str,
    base_url: str,
    model: str,
    api: str = "openai",
    key_from_stdin: bool = False,
    no_key: bool = False,
    default: bool = False,
    max_tokens_per_call: int = 8192,
    timeout: float = 300.0,
    prices: tuple[float, float] | None = None,
) -> None:
    """Add a model provider (root): a [providers.NAME] table in /etc/cairn/providers.toml
    and its key, encrypted with systemd-creds, as cairn-provider-NAME in
    /etc/credstore.encrypted. Without --key-from-stdin or --no-key, asks for the key on a
    terminal.

    Example: printf '%s\\n' "$KEY" | sudo cairn provider add openai
    --base-url https://api.openai.com/v1 --model gpt-4.1-mini --key-from-stdin
    """
    from cairn import provider_setup as setup  # only these commands load it

    _need_root("add", WRITES)
    if api not in ("openai", "anthropic"):
        fail(f"--api must be openai or anthropic, not {api!r}", code=2)
    if key_from_stdin and no_key:
        fail("--key-from-stdin and --no-key contradict each other", code=2)
    new = setup.NewProvider(
        name=name, base_url=base_url, model=model, api=api,  # type: ignore[arg-type]
        keyed=not no_key, max_tokens_per_call=max_tokens_per_call, timeout_sec=timeout,
        input_price_per_million=prices[0] if prices else None,
        output_price_per_million=prices[1] if prices else None,
    )
    file = setup.default_file()
    credential = setup.credential_name(name)
    text = setup.with_provider(setup.read_text(file), new, make_default=default, file=file)
    if new.keyed:
        held = [p for p in setup.existing_keys(credential) if p.parent == setup.etc_stores()[1]]
        if held:
            fail(f"a key named {credential} is already stored in {held[0]}",
                 hint="remove that file first, or add the provider under another name")
        key = setup.checked_key(_read_key(name, key_from_stdin), credential)
        stored = setup.store_key(credential, key)
    setup.write_text(file, text)
    echo(f"provider {name}: {model} at {base_url} ({api} API), added to {file}")
    if new.keyed:
        echo(f"key: encrypted as {stored} (the coordinator imports it as {credential})")
    loaded = setup.parsed(text, file)
    if loaded.default == name:
        echo(f"{name} is the default provider")
    echo(f"check it: sudo cairn provider test {name}")


@provider_app.command("list")
@json_flag
def provider_list(json_out: bool = False) -> None:
    """List the providers in /etc/cairn/providers.toml, the default marked *, and where
    each one's key is (encrypted, stored, missing, none; unknown unless root).

    Example: cairn provider list
    """
    from cairn.provider_setup import key_state
    from cairn.providers import load_providers

    providers = load_providers()
    rows = [
        {
            "name": name,
            "default": name == providers.default,
            "api": entry.api,
            "base_url": entry.base_url,
            "model": entry.model,
            "credential": entry.credential,
            "key": key_state(entry.credential),
        }
        for name, entry in sorted(providers.providers.items())
    ]
    if json_out:
        emit(rows)
        return
    if not rows:
        echo("no model provider is configured; add one with: sudo cairn provider add NAME "
             "--base-url URL --model MODEL")
        return
    table = [["  NAME", "API", "MODEL", "BASE URL", "KEY"]] + [
        [("* " if r["default"] else "  ") + str(r["name"]), str(r["api"]), str(r["model"]),
         str(r["base_url"]), str(r["key"])]
        for r in rows
    ]
    for line in columns(table):
        click.echo(line)


@provider_app.command("test")
@name_argument
def provider_test(name: str) -> None:
    """Ask provider NAME for one short answer (at most 64 tokens) through the model relay a
    run uses, with the key the coordinator would get (root). Prints the model's answer or
    the provider's error in one line; exits 1 when the provider did not answer.

    Example: sudo cairn provider test openai
    """
    from cairn.protocol.names import is_provider_name
    from cairn.provider_setup import probe_provider

    _need_root("test", "only the coordinator's unit may read a provider key")
    if not is_provider_name(name):
        fail(f"{name!r} is not a provider name",
             hint="'cairn provider list' shows the providers of this host", code=2)
    answered, line = probe_provider(name)
    echo(line)
    if not answered:
        raise click.exceptions.Exit(1)


@provider_app.command("rm")
@name_argument
@dry_run_flag
@yes_flag
def provider_rm(name: str, dry_run: bool = False, yes: bool = False) -> None:
    """Remove provider NAME (root): its table in /etc/cairn/providers.toml, the default
    if it was, and its key in /etc/credstore.encrypted or /etc/credstore. Runs already
    launched keep the route they froze but can no longer read the key.

    Example: sudo cairn provider rm local
    """
    from cairn import provider_setup as setup

    _need_root("rm", WRITES)
    file = setup.default_file()
    before = setup.read_text(file)
    text = setup.without_provider(before, name, file=file)
    # only the key this command's add would have stored: a credential the administrator
    # named otherwise may serve something else too
    credential = setup.parsed(before, file).providers[name].credential
    own = credential == setup.credential_name(name)
    if dry_run:
        would(f"remove provider {name} from {file}" + (f" and its key {credential}" if own
                                                        else ""))
    confirm_or_stop(f"remove provider {name}" + (f" and its key {credential}?" if own else "?"),
                    yes=yes)
    setup.write_text(file, text)
    gone = setup.remove_keys(credential) if own else []
    echo(f"provider {name} removed from {file}"
         + (f"; key {', '.join(map(str, gone))} deleted" if gone else ""))


# One removal verb everywhere (rm); the words people also type stay, hidden.
hidden_alias(provider_app, provider_rm, "remove")
hidden_alias(provider_app, provider_rm, "delete")
