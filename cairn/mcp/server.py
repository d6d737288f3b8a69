"""The server loop of ``cairn mcp``: one JSON-RPC message a line on stdin, one answer a
line on stdout (nothing else is ever written there; logs go to stderr).

``tools/call`` runs in a thread of its own, so a ``ping`` or a second call is answered
while ``cairn_watch`` follows a run; every line is written whole under one lock. A call
that asks the client something (a launch form) waits in its thread for the answer, which
the reading loop hands over by the request's ID.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import IO

from pydantic import BaseModel, ValidationError

from cairn.errors import CairnError, Unavailable
from cairn.mcp.tools import Reporter, Session, UnknownTool, call_tool, list_tools
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.mcp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    CallToolParams,
    CallToolResult,
    CancelledParams,
    ElicitAnswer,
    ElicitForm,
    ElicitParams,
    ErrorObject,
    InitializeParams,
    InitializeResult,
    ListToolsResult,
    Message,
    ProgressParams,
    RequestId,
    ServerInfo,
    TextContent,
    can_elicit,
    negotiate,
    notification_line,
    request_line,
    response_line,
)
from cairn.terminal import printable
from cairn.validation import first_error

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Cairn runs reviewed AI-agent workflows as durable, sandboxed runs. Each workflow tool "
    "launches one on a project and returns its run ID; follow it with cairn_watch, read it "
    "with cairn_show, answer its questions with cairn_inbox and cairn_answer; write a new "
    "workflow as a draft with cairn_workflow_draft. Approving an operation, applying a "
    "proposal and installing a draft are a person's acts in their terminal, never a tool's."
)


FORM_SECONDS = 900  # how long a launch form waits for the person


class _Asked:
    """A request this server sent the client, until its response arrives."""

    def __init__(self) -> None:
        self.answered = threading.Event()
        self.result: JSONValue = None
        self.error: JSONValue = None


class ProtocolError(Exception):
    """A request answered with a JSON-RPC error instead of a result."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def one_line(exc: CairnError) -> str:
    """An error as one line of text a harness may show as it is: it may quote a name an
    agent chose, so every control character is escaped."""
    return printable(exc.message + (f" (hint: {exc.hint})" if exc.hint else ""))


class Server:
    """Answers one client on ``out``; :meth:`serve` reads its lines until end of input."""

    def __init__(self, out: IO[bytes], session: Session, version: str) -> None:
        self.out = out
        self.session = session
        self.version = version
        self.lock = threading.Lock()
        self.calls: list[threading.Thread] = []
        self.cancels: dict[RequestId, threading.Event] = {}
        self.asked: dict[RequestId, _Asked] = {}
        self.asked_count = 0
        self.forms = False  # whether the client said it shows elicitation forms
        self.ended = threading.Event()  # end of input: no answer can come any more
        self.form_seconds: float = FORM_SECONDS
        self.handlers: dict[str, Callable[[JSONObject], BaseModel | None]] = {
            "initialize": self._initialize,
            "ping": lambda params: None,
            "tools/list": lambda params: ListToolsResult(tools=list_tools()),
        }

    def write(self, line: bytes) -> None:
        with self.lock:
            self.out.write(line)
            self.out.flush()

    def serve(self, lines: Iterable[bytes]) -> None:
        """Answer every line; at end of input, finish the calls still running (a client
        that is done closes stdin and waits for the process to exit)."""
        for raw in lines:
            if raw.strip():
                self.handle(raw)
        self.ended.set()
        for thread in list(self.calls):
            thread.join()

    def handle(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            self._error(None, PARSE_ERROR, f"not JSON: {exc}")
            return
        try:
            message = Message.model_validate(data)
        except ValidationError as exc:
            where, what = first_error(exc, top="message")
            known = data.get("id") if isinstance(data, dict) else None
            request_id = known if isinstance(known, int | str) else None
            self._error(request_id, INVALID_REQUEST, f"not a JSON-RPC 2.0 message: {where}: {what}")
            return
        if message.method == "notifications/cancelled" and message.id is None:
            self._cancel(message.params or {})
            return
        if message.method is None and message.id is not None:
            self._response(message)
            return
        if message.method is None or message.id is None:
            return  # another notification (initialized): nothing to say
        params = message.params or {}
        if message.method == "tools/call":
            self._start_call(message.id, params)
            return
        handler = self.handlers.get(message.method)
        if handler is None:
            self._error(message.id, METHOD_NOT_FOUND, f"method {message.method!r} is not served")
            return
        try:
            result = handler(params)
        except ValidationError as exc:
            where, what = first_error(exc, top="params")
            self._error(message.id, INVALID_PARAMS, f"{message.method}: {where}: {what}")
            return
        except CairnError as exc:
            self._error(message.id, INTERNAL_ERROR, one_line(exc))
            return
        self.write(response_line(message.id, result))

    def _error(self, request_id: RequestId | None, code: int, text: str) -> None:
        message = printable(text)
        self.write(response_line(request_id, error=ErrorObject(code=code, message=message)))

    def _initialize(self, params: JSONObject) -> InitializeResult:
        asked = InitializeParams.model_validate(params)
        version = negotiate(asked.protocol_version)
        self.forms = can_elicit(version, asked.capabilities)
        return InitializeResult(
            protocol_version=version,
            capabilities={"tools": {"listChanged": False}},
            server_info=ServerInfo(name="cairn", version=self.version),
            instructions=INSTRUCTIONS,
        )

    def _start_call(self, request_id: RequestId, params: JSONObject) -> None:
        try:
            call = CallToolParams.model_validate(params)
        except ValidationError as exc:
            where, what = first_error(exc, top="params")
            self._error(request_id, INVALID_PARAMS, f"tools/call: {where}: {what}")
            return
        cancel = self.cancels[request_id] = threading.Event()
        thread = threading.Thread(
            target=self._call, args=(request_id, call, cancel), name=f"mcp-call-{request_id}",
            daemon=True,
        )
        self.calls = [t for t in self.calls if t.is_alive()]
        self.calls.append(thread)
        thread.start()

    def _reporter(self, call: CallToolParams) -> Reporter | None:
        token = None if call.meta is None else call.meta.progress_token
        if token is None:
            return None

        def report(progress: float, message: str) -> None:
            params = ProgressParams(
                progress_token=token, progress=progress, message=printable(message)
            )
            self.write(notification_line("notifications/progress", params))

        return report

    def _response(self, message: Message) -> None:
        """The client's answer to a request of this server's; one it did not ask, or
        asked and stopped waiting for, is dropped."""
        asked = self.asked.get(message.id) if message.id is not None else None
        if asked is None:
            return
        extra = message.model_extra or {}
        asked.result, asked.error = extra.get("result"), extra.get("error")
        asked.answered.set()

    def _elicitor(self, cancel: threading.Event) -> Callable[[str, ElicitForm], ElicitAnswer]:
        def elicit(text: str, form: ElicitForm) -> ElicitAnswer:
            """Ask the person through the client's form; their answer, or a CairnError
            when the client refused to ask, the call was cancelled, or nobody answered."""
            with self.lock:
                self.asked_count += 1
                request_id = f"cairn-form-{self.asked_count}"
            asked = self.asked[request_id] = _Asked()
            try:
                params = ElicitParams(message=text, requested_schema=form)
                self.write(request_line(request_id, "elicitation/create", params))
                deadline = time.monotonic() + self.form_seconds
                while not asked.answered.wait(0.2):
                    if cancel.is_set() or self.ended.is_set() or time.monotonic() > deadline:
                        raise Unavailable("nobody filled in the launch form; nothing was "
                                          "launched", hint="call the tool again with 'args'")
            finally:
                self.asked.pop(request_id, None)
            if asked.error is not None or not isinstance(asked.result, dict):
                raise Unavailable("the client did not show the launch form; nothing was "
                                  "launched", hint="call the tool again with 'args'")
            try:
                return ElicitAnswer.model_validate(asked.result)
            except ValidationError as exc:
                where, what = first_error(exc, top="result")
                raise Unavailable(f"the launch form's answer is not one: {where}: {what}; "
                                  "nothing was launched") from exc

        return elicit

    def _cancel(self, params: JSONObject) -> None:
        """Stop a running call at its next safe point; it then gets no answer (as the
        protocol asks). An unknown or finished request is ignored."""
        try:
            request_id = CancelledParams.model_validate(params).request_id
        except ValidationError:
            return
        cancel = None if request_id is None else self.cancels.get(request_id)
        if cancel is not None:
            cancel.set()

    def _call(self, request_id: RequestId, call: CallToolParams, cancel: threading.Event) -> None:
        try:
            self._answer_call(request_id, call, cancel)
        finally:
            self.cancels.pop(request_id, None)

    def _answer_call(
        self, request_id: RequestId, call: CallToolParams, cancel: threading.Event
    ) -> None:
        session = replace(self.session, cancelled=cancel.is_set,
                          elicit=self._elicitor(cancel) if self.forms else None)
        try:
            data = call_tool(call.name, call.arguments, session, self._reporter(call))
        except UnknownTool as exc:
            self._error(request_id, INVALID_PARAMS, one_line(exc))
            return
        except ValidationError as exc:
            where, what = first_error(exc)
            result = failed(f"{call.name}: {where}: {what}")
        except CairnError as exc:
            result = failed(one_line(exc))
        except Exception:
            log.exception("tools/call %s failed", call.name)
            self._error(request_id, INTERNAL_ERROR, f"{call.name} failed; see the server's log")
            return
        else:
            # json.dumps escapes every control character: the text is safe to print
            text = json.dumps(data, indent=2, sort_keys=True)
            result = CallToolResult(content=[TextContent(text=text)], structured_content=data)
        if not cancel.is_set():
            self.write(response_line(request_id, result))


def failed(text: str) -> CallToolResult:
    """A tool's refusal, for the model to read (not a protocol error); one line, every
    control character escaped (a harness may print it)."""
    return CallToolResult(content=[TextContent(text=printable(text))], is_error=True)
