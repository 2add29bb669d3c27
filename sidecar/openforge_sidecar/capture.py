"""The capture addon: answers a harness's LLM calls from the policy and records them.

In ``tokens`` mode (for training) each LLM request is parsed by its wire
codec, rendered into prompt token IDs by the rollout's token history, and
rewritten in flight into a token-in/token-out ``/v1/completions`` request to
the engine; the engine's token stream is relayed back to the harness in the
harness's own wire format as it arrives (``flow.response.stream``). In
``passthrough`` mode the request goes upstream unchanged and a tee watches
the answer go by. Either way the finished call becomes a record that is
fsync'd to the spool, then streamed to the collector by the exporter.

Traffic that is not an LLM call passes through untouched. Bad requests get
the error the real API would give. Every outcome is counted in ``stats``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import json
import logging
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http
from openforge import control, endpoints, trajectory
from openforge.api import verdict
from openforge.wire import codecs, conversation
from openforge.wire.codecs import Codec
from openforge.wire.codecs.errors import CodecError

from openforge_sidecar import memory, relay, tee, upstream
from openforge_sidecar.policy import engine, history, signatures, stored, template
from openforge_sidecar.recording import recorder, records, redact

log = logging.getLogger("openforge.sidecar")

CONTROL_HOST = "openforge.sidecar"
MODES = ("tokens", "passthrough")
#: The names ``--api`` (``HarnessEnv``'s ``spec.api``) takes.
API_NAMES = tuple(api.spec_name for api in conversation.WireApi)
STOPPED_EXIT_CODE = records.STOPPED_EXIT_CODE


@dataclass(slots=True)
class _Call:
    """What the addon keeps about one LLM call while it is in flight."""

    index: int
    codec: Codec
    request: conversation.ChatRequest
    request_json: records.Body
    headers: dict[str, str]  # redacted, for the record
    received_ns: int
    started: float
    plan: history.Plan | None = None
    relay: relay.Relay | None = None
    tee: tee.Tee | None = None
    deadline: upstream.Deadline | None = None  # the engine's, while it is being called
    response_id: str = ""
    finished: bool = False
    policy_version: int | None = None  # as the engine reported it for this call
    notes: list[str] = field(default_factory=list)
    # The harness's header fields, until they are redacted into ``headers``.
    raw_headers: tuple[tuple[bytes, bytes], ...] = ()
    journaled: bool = False


class Capture:
    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self._history: history.TokenHistory | None = None
        self._tokenizer: template.PolicyTokenizer | None = None
        self._loading = threading.Lock()
        self._recorder: recorder.Recorder | None = None
        self._collector_token: str | None = None
        self._control_token: str | None = None
        # set once `running` has opened the spool: a connection the proxy accepted
        # before (one queued on an inherited socket) waits for it
        self._serving = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine_model = ""
        self._max_model_len = DEFAULT_MAX_MODEL_LEN
        # the engine's policy version last seen, and whether /v1/models is being reread
        self._engine_version: int | None = None
        self._rereading = False
        self._background: set[asyncio.Task[None]] = set()
        self._trim: asyncio.TimerHandle | None = None  # a collection and trim to come
        self._signer: signatures.Signer | None = None

    # --- mitmproxy lifecycle ------------------------------------------------

    def load(self, loader: Any) -> None:
        loader.add_option(
            "openforge_mode",
            str,
            "tokens",
            "tokens: render and generate token-in/token-out from the engine (training); "
            "passthrough: forward unchanged to the upstream and record what it returns.",
        )
        loader.add_option(
            "openforge_engine",
            str,
            "",
            "Base URL of the inference engine (vLLM or `openforge serve`), e.g. "
            "http://127.0.0.1:8000. Required in tokens mode.",
        )
        loader.add_option(
            "openforge_engine_model",
            str,
            "",
            "Model name sent to the engine (default: the engine's first model).",
        )
        loader.add_option(
            "openforge_tokenizer",
            str,
            "",
            "Directory or engine URL holding tokenizer.json and tokenizer_config.json "
            "(default: the engine).",
        )
        loader.add_option(
            "openforge_max_model_len",
            int,
            0,
            "Context length of the policy; a call's max_tokens is a ceiling, lowered so prompt + "
            "completion fit. 0: the engine's (its /v1/models max_model_len), else 32768; a value "
            "above the engine's is lowered to it.",
        )
        upstream.add_options(loader)
        loader.add_option("openforge_spool", str, "", "Directory of the durable spool (required).")
        loader.add_option(
            "openforge_collector",
            str,
            "",
            "host:port of the trajectory collector; empty: spool only.",
        )
        loader.add_option(
            "openforge_collector_token_file", str, "", "File holding the collector's bearer token."
        )
        loader.add_option(
            "openforge_flush_timeout",
            int,
            30,
            "Seconds to wait on shutdown for the collector to acknowledge everything.",
        )
        loader.add_option(
            "openforge_job", str, "local", "RolloutJob name recorded with every record."
        )
        loader.add_option("openforge_rollout_id", str, "", "Rollout id (default: a new UUID).")
        loader.add_option("openforge_task_id", str, "", "Task id of this rollout.")
        loader.add_option("openforge_sample_index", int, 0, "Sample index within the task's group.")
        loader.add_option("openforge_attempt", int, 0, "Attempt number of this rollout.")
        loader.add_option("openforge_harness", str, "", "Harness name, for the record.")
        loader.add_option(
            "openforge_api",
            str,
            "",
            "The wire API the harness declares (HarnessEnv spec.api, e.g. openai-chat): an LLM "
            "call in another API is refused and recorded as refused. Empty: any.",
        )
        loader.add_option(
            "openforge_policy_version",
            int,
            0,
            "Policy version when the engine does not report one.",
        )
        loader.add_option(
            "openforge_labels",
            str,
            "{}",
            "The rollout's started-record labels, as a JSON object of strings.",
        )
        loader.add_option(
            "openforge_max_body",
            int,
            32 * 1024 * 1024,
            "Largest LLM request body accepted, in bytes.",
        )
        loader.add_option(
            "openforge_ready_file",
            str,
            "",
            "File created once the sidecar serves: its proxy listens and its spool is open.",
        )
        loader.add_option(
            "openforge_finish_on_stop",
            bool,
            False,
            "On shutdown, record a rollout that was never finished as failed (no reward), as a "
            "stopped pod's is.",
        )
        loader.add_option(
            "openforge_control_token_file",
            str,
            "",
            "rollout/finish needs 'Authorization: Bearer' with the token in this file (created, "
            "random, when absent).",
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "openforge_mode" in updated and opts.openforge_mode not in MODES:
            raise exceptions.OptionsError(
                f"openforge_mode must be one of {MODES}, not {opts.openforge_mode!r}"
            )
        if opts.openforge_api not in ("", *API_NAMES):
            raise exceptions.OptionsError(
                f"openforge_api must be one of {API_NAMES} or empty, not {opts.openforge_api!r}"
            )
        if opts.openforge_mode == "tokens" and not opts.openforge_engine:
            raise exceptions.OptionsError("openforge_engine is required in tokens mode")
        if not opts.openforge_spool:
            raise exceptions.OptionsError(
                "openforge_spool is required: every call is spooled before it is exported"
            )
        if not opts.openforge_rollout_id:
            opts.openforge_rollout_id = uuid.uuid4().hex
        if "openforge_control_token_file" in updated:
            # before the proxy listens: whoever waits for the port may read the token then
            path = opts.openforge_control_token_file
            try:
                self._control_token = control.ensure(path) if path else None
            except (OSError, ValueError) as exc:
                raise exceptions.OptionsError(f"openforge_control_token_file: {exc}") from exc

    async def running(self) -> None:
        opts = ctx.options
        self._loop = asyncio.get_running_loop()
        memory.map_large_buffers()
        directory = Path(opts.openforge_spool)
        if opts.openforge_collector_token_file:
            self._collector_token = Path(opts.openforge_collector_token_file).read_text().strip()
        self._recorder = recorder.Recorder(
            directory,
            identity=recorder.Identity(
                job=opts.openforge_job,
                rollout_id=opts.openforge_rollout_id,
                task_id=opts.openforge_task_id,
                sample_index=opts.openforge_sample_index,
                attempt=opts.openforge_attempt,
                harness=opts.openforge_harness,
                policy_version=opts.openforge_policy_version,
                labels=json.loads(opts.openforge_labels or "{}"),
            ),
            stats=self.stats,
        )
        self._signer = signatures.Signer.in_directory(directory)  # beside the spool it made
        resumed_at = self._recorder.calls
        self._serving.set()
        if opts.openforge_ready_file:
            # the servers listen before any addon's `running` hook is called
            ready = Path(opts.openforge_ready_file)
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.touch()
        if opts.openforge_mode == "tokens":
            try:
                await asyncio.to_thread(self._ensure_tokenizer)
            except OSError as exc:  # engine not up yet: retried on the first call
                log.warning("tokenizer not loaded yet (%s); will retry on the first call", exc)
        await self._export()
        if self._recorder.restarted:
            log.warning(
                "sidecar restarted: resuming at call %d; token history starts a new segment",
                resumed_at,
            )

    async def _export(self) -> None:
        """Start streaming the spool to the collector (``openforge_collector``), once.

        Not before the proxy serves: importing gRPC is 50 ms of CPU, which a
        rollout pod's first call would wait for. It is imported in a worker
        thread after the tokenizer, while the first calls wait on the engine.
        Until then records wait, fsync'd, in the spool; a stop or a finish
        that comes first starts the exporter itself, so it is never skipped.
        """
        collector = ctx.options.openforge_collector
        if collector and self._recorder is not None:
            await self._recorder.export(collector, token=self._collector_token)

    async def done(self) -> None:
        recording = self._recorder
        if recording is not None:
            if ctx.options.openforge_finish_on_stop and not recording.finished:
                log.warning("stopped before the rollout was finished: recording it as stopped")
                recording.finish(
                    exit_code=STOPPED_EXIT_CODE,
                    reward=None,
                    grader_output="",
                    status=trajectory.STOPPED,
                )
            await self._export()
            await recording.close(flush_timeout=ctx.options.openforge_flush_timeout)
        log.info("openforge capture stats: %s", dict(self.stats))

    # --- HTTP hooks -----------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        received_ns, started = time.time_ns(), time.monotonic()
        if not self._serving.is_set():
            await self._serving.wait()
        path = flow.request.path
        if path.startswith(endpoints.PREFIX) or _to_control_host(flow.request):
            await self._control(flow)
            return
        if flow.request.method == "POST" and ctx.options.openforge_mode == "tokens":
            counter = codecs.counter_for_path(path)
            if counter is not None:
                await self._count_tokens(flow, counter)
                return
        codec = codecs.for_path(path) if flow.request.method == "POST" else None
        if codec is None:
            self.stats["non_llm_passed"] += 1
            return
        body = flow.request.get_content(strict=False) or b""
        limit = ctx.options.openforge_max_body
        try:
            if len(body) > limit:
                raise CodecError(
                    f"request body of {len(body)} bytes exceeds the limit of {limit}", status=413
                )
            _check_declared_api(codec, path)
            request = codec.parse_request(body)
            self._check_signatures(request)
        except CodecError as exc:
            self._reject(flow, codec, status=exc.status, message=str(exc))
            self._record_rejected(flow, codec, body=body if len(body) <= limit else b"", exc=exc)
            return
        index = self._recording().claim_call_index()
        tokens = ctx.options.openforge_mode == "tokens"
        redacted = redact.body(body, request.extra)
        call = _Call(
            index=index,
            codec=codec,
            request=request,
            # a large body waits in a file; in passthrough mitmproxy keeps its own copy
            request_json=self._recording().stash(index, redacted) if tokens else redacted,
            headers={},
            received_ns=received_ns,
            started=started,
            raw_headers=flow.request.headers.fields,
        )
        del body, request, redacted  # the call has them, as long as it needs them
        flow.metadata["openforge"] = call
        self.stats["calls"] += 1
        self.stats["streamed" if call.request.stream else "unstreamed"] += 1
        if tokens:
            flow.request.raw_content = b""  # parsed: the engine gets a body of its own
            try:
                rewritten = await self._to_engine(flow, call)
            except Exception as exc:  # else mitmproxy would send the request on unrewritten
                self.stats["rewrite_failed"] += 1
                log.exception("rewriting call %d for the engine failed", index)
                self._fail(
                    flow, call, status=500, message=f"the sidecar could not rewrite it: {exc!r}"
                )
                return
            if not rewritten:
                return  # answered with an error, and spooled
            call.deadline = upstream.Deadline(flow)
            call.deadline.start()
        # mitmproxy sends the request on as this hook returns; what the call
        # needs only once the answer comes back is done right after that.
        asyncio.get_running_loop().call_soon(self._after_forward, call)

    def _check_signatures(self, request: conversation.ChatRequest) -> None:
        """Refuse a replayed thinking block whose signature is ours but not its text's."""
        if self._signer is None or ctx.options.openforge_mode != "tokens":
            return
        position = self._signer.forged(request)
        if position is not None:
            raise CodecError(
                f"the signature of thinking block {position + 1} (counted across the "
                "messages) does not match its thinking: it was edited or forged",
                field="messages",
            )

    def _after_forward(self, call: _Call) -> None:
        """Finish taking a call in while its request is on its way (see :meth:`request`).

        Runs in the event loop's next round, so after the request was
        written to the upstream and before the loop reads anything new: the
        journal has the call and the relay is ready before any byte of the
        answer can arrive, and the time it takes overlaps the engine's. (On
        Python >= 3.12 mitmproxy's master runs hook tasks eagerly, and this
        comes before the request is written: as correct, without the overlap.
        The sidecar's image runs 3.11.)
        """
        if call.finished:
            return  # spooled already (its connection failed while the tokenizer loaded)
        try:
            self._journal_call(call)
            if call.plan is not None and call.relay is None and self._tokenizer is not None:
                call.relay = self._relay(call, self._tokenizer)
        except Exception:  # a callback's exception would only reach asyncio's handler
            # Without a relay the engine's answer is refused whole (502) and spooled.
            self.stats["intake_failed"] += 1
            log.exception("taking call %d in failed", call.index)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        call: _Call | None = flow.metadata.get("openforge")
        if call is None or flow.response is None:
            return
        response = flow.response
        if ctx.options.openforge_mode == "passthrough":
            call.tee = tee.Tee(
                codec=call.codec,
                streamed="text/event-stream" in response.headers.get("content-type", ""),
                content_encoding=response.headers.get("content-encoding", ""),
            )
            response.stream = _teeing(call)
            return
        if call.deadline is not None:
            call.deadline.answering()
            # The engine answers, so its request went out whole: its body, the prompt's IDs
            # as JSON (a large call's: more than its request), is not needed again.
            flow.request.raw_content = b""
        if response.status_code != 200 or call.relay is None:
            return  # the engine's error is translated whole in `response`
        version = response.headers.get(endpoints.POLICY_VERSION_HEADER, "")
        if version.isdigit():
            call.policy_version = int(version)
            if call.policy_version != self._engine_version:
                if self._engine_version is not None:
                    self._reread_served_model(f"policy version {call.policy_version}")
                self._engine_version = call.policy_version
        for name in ("content-length", "content-encoding", "etag"):
            response.headers.pop(name, None)
        if not call.request.stream:
            # A harness that asked for one JSON body gets nothing before the end, so
            # the engine's stream is read whole and relayed in `response`: an answer
            # that fails midway can then still be the API's error, not a 200.
            response.headers["content-type"] = "application/json"
            return
        response.headers["content-type"] = "text/event-stream"
        response.headers["cache-control"] = "no-cache"
        response.stream = _guarded(call)

    def response(self, flow: http.HTTPFlow) -> None:
        call: _Call | None = flow.metadata.get("openforge")
        if call is None or call.finished or flow.response is None:
            return
        if call.deadline is not None:
            call.deadline.cancel()
        if ctx.options.openforge_mode == "passthrough":
            self._finish_passthrough(flow, call)
        else:
            self._finish_tokens(flow, call)

    def error(self, flow: http.HTTPFlow) -> None:
        call: _Call | None = flow.metadata.get("openforge")
        if call is None or call.finished:
            return
        if call.deadline is not None:
            call.deadline.cancel()
        message = flow.error.msg if flow.error else "unknown error"
        self.stats["failed_calls"] += 1
        if ctx.options.openforge_mode == "tokens" and upstream.engine_failed(flow, call.deadline):
            self._answer_engine_failure(flow, call, message=message)
            return
        self._spool_call(
            call,
            status=flow.response.status_code if flow.response else 502,
            error=f"connection failed: {message}",
        )

    def _answer_engine_failure(self, flow: http.HTTPFlow, call: _Call, *, message: str) -> None:
        """The harness's answer when the engine timed out, refused or broke off: the API's
        error object (504 for a deadline, else 502), or, once a streamed answer began,
        its end with the API's error event (see :mod:`upstream`)."""
        expired = call.deadline.expired if call.deadline is not None else ""
        status = 504 if expired else 502
        reason = f"the engine failed: {expired or message}"
        response = flow.response
        if response is not None and response.stream and call.relay is not None:
            status = response.status_code  # the head went out: the error is the stream's end
            data = upstream.rest_of_stream(response, call.relay.fail(reason))
        else:
            body = json.dumps(call.codec.error_body(status, reason)).encode()
            data = upstream.error_response(status, body)
        delivered = upstream.answer_client(flow, data)
        self.stats["engine_timeouts" if expired else "engine_unreachable"] += 1
        log.warning("call %d: %s (the harness %s)", call.index, reason,
                    "was answered" if delivered else "was gone")  # fmt: skip
        self._spool_call(call, status=status, error=reason)

    # --- tokens mode ----------------------------------------------------------

    async def _to_engine(self, flow: http.HTTPFlow, call: _Call) -> bool:
        """Rewrite the call's request into the engine's token-in/token-out one.

        False when the call was answered with an error instead (and spooled).
        """
        try:
            tokenizer = await self._policy_tokenizer()
        except OSError as exc:
            self._fail(flow, call, status=503, message=f"policy tokenizer unavailable: {exc}")
            return False
        assert self._history is not None
        # A large call is one whose body was stashed: over recorder.STASH_BYTES (that is,
        # memory.LARGE_BYTES), unless the disk refused the file (then it stays in memory,
        # and so does the rest of the call).
        large = isinstance(call.request_json, records.Stashed)
        if large:
            # What reading and parsing its body freed goes back to the OS before the
            # prompt is rendered and encoded beside its messages (in a worker thread: a
            # trim of a large, fragmented heap takes ~0.1 s).
            await asyncio.to_thread(memory.return_freed_memory)
        plan = call.plan = self._history.plan(call.request)
        if large:
            # A large call's messages are let go of once planned: the history keeps their
            # keys (so it does not render them ahead for the next call), and nothing
            # after needs them.
            call.request = dataclasses.replace(call.request, messages=())
            # Its prompt's IDs wait in a file until the call ends (see stash_ids; the
            # history wrote a long prompt's to one as they were made), and the engine's
            # request is written from it.
            plan = call.plan = dataclasses.replace(
                plan, prompt_ids=self._recording().stash_ids(call.index, plan.prompt_ids)
            )
            # and their text goes back to the OS before the engine's request is built
            await asyncio.to_thread(memory.return_freed_memory)
        build = functools.partial(
            engine.completion_body,
            model=ctx.options.openforge_engine_model or self._engine_model,
            prompt_ids=plan.prompt_ids,
            sampling=call.request.sampling,
            stop_token_ids=tokenizer.stop_token_ids,
            max_model_len=self._max_model_len,
        )
        # a large call's in a worker thread: millions of IDs, read from their file
        body = await asyncio.to_thread(build) if large else build()
        target = urllib.parse.urlsplit(ctx.options.openforge_engine)
        headers = engine.request_headers(flow.request.headers.fields, target.netloc)
        # Without a Host header, setting host and port does not rewrite one (twice) for nothing.
        flow.request.headers.fields = ()
        flow.request.scheme = target.scheme or "http"
        flow.request.host = target.hostname or "127.0.0.1"
        flow.request.port = target.port or (443 if flow.request.scheme == "https" else 80)
        flow.request.path = target.path.rstrip("/") + "/v1/completions"
        flow.request.method = "POST"
        flow.request.headers.fields = headers
        flow.request.content = body
        if large:
            # sent as a view of itself: asyncio (3.11) copies what the socket does not take
            # at once into its buffer, and a bytes body's rest would be sliced off (a copy)
            # first: three times the body, not two, at the moment it is written. (mitmproxy
            # hands the content to the socket as it is.)
            flow.request.data.content = memoryview(body)  # type: ignore[assignment]
            del body
            # and what building the body freed goes back to the OS before it is sent (the
            # C heap's holes, refilled as its buffer grew, were ~15 MB for 30 MB)
            await asyncio.to_thread(memory.return_freed_memory)
        return True

    def _relay(self, call: _Call, tokenizer: template.PolicyTokenizer) -> relay.Relay:
        """The relay that turns the engine's stream for ``call`` into the harness's answer."""
        assert call.plan is not None
        call.response_id = _response_id(call.codec, call.index)
        return relay.Relay(
            codec=call.codec,
            request=call.request,
            detokenizer=template.IncrementalDetokenizer(tokenizer),
            stop_token_ids=tokenizer.stop_token_ids,
            prompt_ids=call.plan.prompt_ids,
            response_id=call.response_id,
            created=int(time.time()),
            sign=self._signer.sign if self._signer is not None else None,
        )

    async def _count_tokens(self, flow: http.HTTPFlow, counter: codecs.TokenCounter) -> None:
        """Answer a token-counting call (Gemini's ``countTokens``) from the policy tokenizer.

        It is no model call, so nothing is recorded; it is counted in the stats.
        """
        try:
            request = counter.parse_count_request(flow.request.get_content(strict=False) or b"")
            tokenizer = await self._policy_tokenizer()
        except CodecError as exc:
            self._reject(flow, counter, status=exc.status, message=str(exc))
            return
        except OSError as exc:
            self._reject(flow, counter, status=503, message=f"policy tokenizer unavailable: {exc}")
            return
        text = tokenizer.render(request.messages, request.tools, add_generation_prompt=False)
        flow.response = _json_response(200, counter.count_response(len(tokenizer.encode(text))))
        self.stats["token_counts_answered"] += 1

    def _finish_tokens(self, flow: http.HTTPFlow, call: _Call) -> None:
        assert flow.response is not None
        response = flow.response
        if response.status_code == 200 and call.relay is None:
            self._fail(
                flow,
                call,
                status=502,
                message="the sidecar could not take the call in (no relay; see the log)",
            )
            return
        if response.status_code != 200 or call.relay is None:
            detail = (response.get_content(strict=False) or b"")[:500].decode(errors="replace")
            self.stats["engine_errors"] += 1
            status = response.status_code if response.status_code in _ENGINE_STATUSES_KEPT else 502
            retry_after = response.headers.get("retry-after")
            if response.status_code in (400, 404):  # e.g. another model, another context length
                self._reread_served_model(f"the engine answered {response.status_code}")
            self._fail(
                flow,
                call,
                status=status,
                message=f"engine answered {response.status_code}: {detail}",
            )
            if retry_after is not None and flow.response is not None:
                flow.response.headers["retry-after"] = retry_after
            return
        if not call.request.stream and not _relay_whole(call.relay, response):
            self.stats["engine_errors"] += 1
            self._fail(
                flow, call, status=502, message=f"the engine's answer failed: {call.relay.error}"
            )
            return
        if not call.relay.done:
            self.stats["engine_errors"] += 1
            self._fail(
                flow, call, status=502, message="the engine's stream ended before the relay did"
            )
            return
        # The rest waits until the harness has the end of its answer, as
        # spooling does (see _spool_after_answer), and still comes before the
        # harness's next call is read, which may continue this conversation.
        call.finished = True
        asyncio.get_running_loop().call_soon(self._close_answered, call)

    def _close_answered(self, call: _Call) -> None:
        """Check, remember and spool a call the engine answered, then render ahead for the next."""
        result = call.relay
        recorded = False
        try:
            assert result is not None
            if result.error:
                self.stats["engine_errors"] += 1
            if result.echo_matches is False:  # compared as it came (see policy.echo)
                call.notes.append("engine echoed different prompt_token_ids")
                self.stats["prompt_mismatch"] += 1
            elif result.echo_unread is not None:
                self.stats["echo_unchecked"] += 1
                log.warning(
                    "call %d: the engine's echo was not compared: %s",
                    call.index,
                    result.echo_unread,
                )
            if (
                self._history is not None
                and call.plan is not None
                and result.completion is not None
                and not result.error
            ):
                self._history.record(
                    call.request,
                    call.plan,
                    reply=result.completion.message,
                    completion_ids=result.token_ids,
                )
                recorded = True
        except Exception:  # a callback's exception would only reach asyncio's handler
            self.stats["history_failed"] += 1
            log.exception("remembering call %d failed", call.index)
        self._spool_soon(
            call,
            200,
            error=(result.error if result else None) or "; ".join(call.notes),
            response_json=None,
        )
        if recorded and self._history is not None:
            # the next call's first rendering (see TokenHistory.prerender)
            self._history.prerender()

    def _record_rejected(
        self, flow: http.HTTPFlow, codec: Codec, *, body: bytes, exc: CodecError
    ) -> None:
        """A refused LLM request is a call too: recorded, with its error."""
        call = _Call(
            index=self._recording().claim_call_index(),
            codec=codec,
            request=conversation.ChatRequest(api=codec.api, model="", messages=()),
            request_json=redact.body(body),
            headers={},
            received_ns=time.time_ns(),
            started=time.monotonic(),
            raw_headers=flow.request.headers.fields,
        )
        self._spool_call(
            call,
            status=exc.status,
            error=f"rejected: {exc}",
            response_json=json.dumps(codec.error_body(exc.status, str(exc))).encode(),
        )

    def _fail(self, flow: http.HTTPFlow, call: _Call, *, status: int, message: str) -> None:
        self._reject(flow, call.codec, status=status, message=message)
        self._spool_call(call, status=status, error=message)

    # --- passthrough mode -------------------------------------------------------

    def _finish_passthrough(self, flow: http.HTTPFlow, call: _Call) -> None:
        assert flow.response is not None
        result = call.tee
        if result is None:  # body was not streamed through the tee (e.g. set by another addon)
            result = tee.Tee(codec=call.codec, streamed=False, content_encoding="")
            result(flow.response.get_content(strict=False) or b"")
        if not result.done:
            result(b"")
        response_json = result.response_json
        if result.completion is not None and (call.request.stream or not response_json):
            body = call.codec.build_response(
                call.request,
                result.completion,
                response_id=_response_id(call.codec, call.index),
                created=int(time.time()),
            )
            response_json = json.dumps(body, separators=(",", ":")).encode()
        status = flow.response.status_code
        error = result.error or ("" if status < 400 else f"upstream answered {status}")
        self._spool_after_answer(call, status=status, error=error, response_json=response_json)

    # --- records ------------------------------------------------------------------

    def _spool_after_answer(
        self, call: _Call, *, status: int, error: str, response_json: bytes | None = None
    ) -> None:
        """Spool a call from the response hook once the harness has the end of its answer.

        mitmproxy sends the end of a response (the chunked terminator) only
        after the response hook returns, so whatever the hook does is latency
        for the harness: building the record, and handing it to the spool
        writer, whose thread then takes the GIL to serialize it. Done in the
        event loop's next round instead, it comes after that send and before
        the loop reads anything new, so before any later call of the harness
        (and its rollout/finish) is seen. The record is durable as any other:
        fsync'd by the writer, then exported.
        """
        call.finished = True  # an error hook for this flow in the meantime spools nothing
        asyncio.get_running_loop().call_soon(
            functools.partial(
                self._spool_soon, call, status, error=error, response_json=response_json
            )
        )

    def _spool_soon(
        self, call: _Call, status: int, *, error: str, response_json: bytes | None
    ) -> None:
        try:
            self._spool_call(call, status=status, error=error, response_json=response_json)
        except Exception as exc:  # a callback's exception would only reach asyncio's handler
            self.stats["spool_failed"] += 1
            log.exception("spooling call %d failed", call.index)
            # still the call's files (not queued): a large body, a long prompt's IDs
            if isinstance(call.request_json, records.Stashed):
                call.request_json.discard()
            if call.plan is not None and isinstance(call.plan.prompt_ids, stored.StoredIds):
                call.plan.prompt_ids.discard()
            # Never silently: the call is reported lost, with why.
            try:
                self._recording().lose(
                    f"recording call {call.index} failed: {exc!r}",
                    whole=False,
                    call_index=call.index,
                )
            except Exception:
                log.exception("reporting call %d as lost failed", call.index)

    def _spool_call(
        self, call: _Call, *, status: int, error: str, response_json: bytes | None = None
    ) -> None:
        call.finished = True
        self._journal_call(call)  # when it ends before its request went on
        opts = ctx.options
        now = time.monotonic()
        result = call.relay
        source = result if result is not None else call.tee
        first = result.first_output_at if result is not None else None
        completion = source.completion if source is not None else None
        finish = completion.finish_reason if completion is not None and not error else "error"
        plan = call.plan
        prompt_ids = (
            plan.prompt_ids if plan is not None else (call.tee.prompt_ids or [] if call.tee else [])
        )
        if error:
            self.stats["calls_with_error"] += 1
        if plan is not None and self._history is not None:
            self._history.finished(plan)
        finished = records.Call(
            call_index=call.index,
            api=call.codec.api,
            token_mode=opts.openforge_mode == "tokens",
            stream=call.request.stream,
            model=call.request.model,
            request_json=call.request_json,
            response_json=response_json
            if response_json is not None
            else (result.response_json if result else b""),
            http_status=status,
            request_headers=call.headers,
            prompt_ids=prompt_ids,
            completion_ids=source.token_ids if source is not None else [],
            logprobs=source.logprobs if source is not None else [],
            finish_reason=finish,
            segment_index=plan.segment_index if plan else 0,
            segment_reason=plan.segment_reason if plan else "",
            prefix_token_count=plan.prefix_token_count if plan else 0,
            policy_version=opts.openforge_policy_version
            if call.policy_version is None
            else call.policy_version,
            received_ns=call.received_ns,
            ttft_ms=(first - call.started) * 1000
            if first is not None and call.request.stream
            else 0.0,
            total_ms=(now - call.started) * 1000,
            error=error,
        )
        self._recording().call(finished)
        if _release(call):
            self._trim_soon()

    def _trim_soon(self) -> None:
        """Collect the garbage and hand freed memory back to the OS shortly, once (see
        :func:`_release`): by then mitmproxy has let go of the flow, with its bodies,
        and the spool writer has written the record."""
        if self._trim is not None:
            return

        def trim() -> None:
            self._trim = None
            gc.collect()
            # the C heap's trim in a worker thread: the loop's streams must not wait for it
            asyncio.get_running_loop().run_in_executor(None, memory.return_freed_memory)

        self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, trim)

    def _recording(self) -> recorder.Recorder:
        if self._recorder is None:
            raise RuntimeError("capture addon is not running (no recorder)")
        return self._recorder

    def _journal_call(self, call: _Call) -> None:
        """Note the call in the recorder's in-flight journal, once, before it is answered
        (:meth:`Recorder.journal <openforge_sidecar.recording.recorder.Recorder.journal>`),
        and redact its headers for the record."""
        if call.journaled:
            return
        self._recording().journal(call.index)
        call.journaled = True
        call.headers = redact.header_fields(call.raw_headers)
        call.raw_headers = ()

    async def _policy_tokenizer(self) -> template.PolicyTokenizer:
        if self._tokenizer is not None:
            return self._tokenizer
        return await asyncio.to_thread(self._ensure_tokenizer)

    def _ensure_tokenizer(self) -> template.PolicyTokenizer:
        """Load the tokenizer, the engine's model name and the token history, once.

        Runs in a worker thread while the proxy already accepts calls, so a
        call can come in mid-load. The tokenizer is published last, since a
        call that finds it goes on without waiting: published first, it would
        let such a call find no history, fail in the request hook and go
        upstream unrewritten (the engine would answer "404 Not Found"). The lock
        makes a call that finds nothing wait for the load under way.
        """
        with self._loading:
            if self._tokenizer is None:
                opts = ctx.options
                tokenizer = template.PolicyTokenizer.load(
                    opts.openforge_tokenizer or opts.openforge_engine
                )
                try:
                    served = _served_model(opts.openforge_engine)
                except OSError:
                    if not opts.openforge_engine_model:
                        raise
                    served = _ServedModel(opts.openforge_engine_model, None)  # its context unknown
                self._engine_model = served.name
                self._max_model_len = context_length(
                    opts.openforge_max_model_len, served.max_model_len
                )
                restarted = self._recorder is not None and self._recorder.restarted
                reason = "sidecar_restarted" if restarted else "first"
                self._history = history.TokenHistory(
                    tokenizer,
                    first_reason=reason,
                    spill=Path(opts.openforge_spool) / records.STASH_DIRECTORY / "heads",
                )
                self._tokenizer = tokenizer
                memory.return_freed_memory()
            return self._tokenizer

    def _reread_served_model(self, reason: str) -> None:
        """Read the engine's model name and context length again, in a worker thread.

        Done when the engine reports a new policy version (its weights or its
        model changed) or refuses a call as a request it cannot serve; the
        calls planned until the answer comes keep the old figures. One reread
        at a time; a failed one keeps them too.
        """
        opts = ctx.options
        if self._rereading or self._tokenizer is None or opts.openforge_mode != "tokens":
            return
        self._rereading = True

        async def reread() -> None:
            try:
                served = await asyncio.to_thread(_served_model, opts.openforge_engine)
            except OSError as exc:
                log.warning("rereading the engine's /v1/models (%s) failed: %s", reason, exc)
                return
            finally:
                self._rereading = False
            length = context_length(opts.openforge_max_model_len, served.max_model_len)
            if (served.name, length) != (self._engine_model, self._max_model_len):
                log.info(
                    "the engine serves %s with a context of %d tokens now (was %s, %d; %s)",
                    served.name, length, self._engine_model, self._max_model_len, reason,
                )  # fmt: skip
                self.stats["engine_model_changes"] += 1
            self._engine_model, self._max_model_len = served.name, length

        task = asyncio.get_running_loop().create_task(reread())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- control API ------------------------------------------------------------------

    async def _control(self, flow: http.HTTPFlow) -> None:
        """``/openforge/v1/stats`` and ``/openforge/v1/rollout/finish``."""
        path = flow.request.path.split("?", 1)[0]
        if path == endpoints.STATS:
            flow.response = _json_response(200, self.snapshot())
            return
        if path == endpoints.ROLLOUT_FINISH and flow.request.method == "POST":
            if self._control_token is not None and not control.allows(
                self._control_token, flow.request.headers.get(control.HEADER)
            ):
                self.stats["finish_refused"] += 1
                log.warning(
                    "refused a rollout/finish without the control token (the harness's own?)"
                )
                flow.response = _json_response(
                    401,
                    {
                        "error": (
                            "rollout/finish needs the control token: Authorization: Bearer <the "
                            "--control-token-file's token>"
                        )
                    },
                )
                return
            try:
                body = json.loads(flow.request.get_content(strict=False) or b"{}")
                report = verdict.Report.parse(body)
            except ValueError as exc:
                flow.response = _json_response(400, {"error": str(exc)})
                return
            await self._finish_rollout(flow, report)
            return
        flow.response = _json_response(404, {"error": f"no control endpoint {path}"})

    async def _finish_rollout(self, flow: http.HTTPFlow, report: verdict.Report) -> None:
        recording = self._recording()
        ticket = recording.finish(
            exit_code=report.exit_code,
            reward=report.reward,
            grader_output=report.grader_output,
            status=report.status,
            retried=report.retried,
        )
        if ticket is not None:
            await asyncio.to_thread(recording.wait, ticket)
        acked = True
        if report.wait_seconds > 0:
            await self._export()
            acked = await recording.flush(report.wait_seconds)
        flow.response = _json_response(200, {**self.snapshot(), "acknowledged": acked})

    def snapshot(self) -> dict[str, Any]:
        merge_rate = self._history.merge_rate if self._history else 0.0
        recording = self._recorder
        return {
            "rollout_id": ctx.options.openforge_rollout_id,
            "calls": recording.calls if recording else 0,
            "merge_rate": merge_rate,
            "counters": dict(self.stats),
            "exporter": recording.exporter_stats() if recording else {},
            "unacked": recording.spool.unacked_count if recording else 0,
        }

    def _reject(
        self, flow: http.HTTPFlow, codec: Codec | codecs.TokenCounter, *, status: int, message: str
    ) -> None:
        self.stats[f"rejected_{status}"] += 1
        log.warning(
            "answering %d to %s %s: %s",
            status,
            flow.request.method,
            redact.path(flow.request.path),
            message,
        )
        flow.response = _json_response(status, codec.error_body(status, message))


#: Engine statuses the harness gets as they are (in its API's shape): a refused
#: request, and the engine asking to be called later (with its ``retry-after``),
#: which an SDK retries. Any other failure of the engine is a 502.
_ENGINE_STATUSES_KEPT = frozenset({400, 429, 503})


def _relay_whole(transform: relay.Relay, response: http.Response) -> bool:
    """Relay a non-streamed call's whole engine answer (see ``responseheaders``).

    The harness's JSON body becomes the response's content; False, with the
    relay's ``error`` set, when the answer failed, so nothing is answered yet.
    """
    try:
        body = _relayed(transform, response.get_content(strict=False) or b"", whole=True)
    except Exception:  # logged and kept on the relay by _relayed
        return False
    if transform.error is not None:
        return False
    response.content = body
    return True


def _check_declared_api(codec: Codec, path: str) -> None:
    """Refuse an LLM call in another API than the one the harness declares (``--api``).

    Its tokens would still be exact, but a HarnessEnv that names the wrong API is a
    mistake its author should hear of at the first call, not in the store.
    """
    declared = ctx.options.openforge_api
    if declared and codec.api.spec_name != declared:
        raise CodecError(
            f"the harness called the {codec.api.spec_name} API (POST {redact.path(path)}), but "
            f"its HarnessEnv declares spec.api: {declared}; set spec.api to the API the "
            "harness speaks",
            status=400,
        )


def _to_control_host(request: http.Request) -> bool:
    """Whether a request is addressed to the sidecar's control host (regular proxy mode).

    ``pretty_host`` parses the Host header (~6 us); it is asked only when the
    name occurs in the header or the request target at all.
    """
    if CONTROL_HOST not in request.host and CONTROL_HOST not in (request.host_header or ""):
        return False
    return request.pretty_host == CONTROL_HOST


def _release(call: _Call) -> bool:
    """Let go of a spooled call's bulk: the request body, the prompt, the relay or tee;
    whether it was a large call, after which memory is collected and trimmed.

    mitmproxy's flows are freed by the cyclic garbage collector, not when
    they end (each HTTP stream layer and its context refer to each other),
    and the flow holds the call (``flow.metadata``) and, through the stream
    callable, its relay. Without this, every finished call's bodies, token
    IDs and events stay resident until a collection reaches the flow's
    generation: under 50 concurrent clients, a few times the calls in flight.
    The record, which has them all, is already with the spool writer.

    After a large call (a request over :data:`TRIM_AFTER_BYTES`) the garbage is
    collected and freed memory handed back to the OS (:meth:`Capture._trim_soon`):
    the tokenizer's and the flow's buffers for a 10 MB request are some 100 MB,
    which glibc would otherwise keep resident for good. Not at once: the flow
    is still in mitmproxy's hands then, and the record not yet serialized.
    """
    large = len(call.request_json) > TRIM_AFTER_BYTES
    call.request_json = b""
    call.headers = {}
    call.plan = None
    call.relay = None
    call.tee = None
    return large


#: A call whose request is larger than this is followed by a collection and a trim...
TRIM_AFTER_BYTES = memory.LARGE_BYTES
#: ...this many seconds later.
TRIM_DELAY_S = 0.5


def _guarded(call: _Call) -> Any:
    """The call's relay as mitmproxy's stream callable.

    Nothing to send must be an empty *list*: mitmproxy writes an empty bytes
    chunk as-is, and on a chunked HTTP/1.1 response that is the terminator,
    which would end the harness's stream early. An exception escaping a
    stream callable kills the connection without a trace, so it is logged
    and kept on the relay (the call is spooled with the error) first. The
    relay is read from the call each time, so that :func:`_release` frees it.
    """

    def stream(data: bytes) -> list[bytes]:
        transform = call.relay
        if transform is None:  # spooled already (the connection failed): nothing more to relay
            return []
        out = _relayed(transform, data)
        return [out] if out else []

    return stream


def _relayed(transform: relay.Relay, data: bytes, *, whole: bool = False) -> bytes:
    """One call of the relay (``whole``: with the engine's whole stream, and its end); an
    exception is logged and kept on the relay (its ``error``, ``done``), so that the call
    is spooled with it, then raised on."""
    try:
        return transform.whole(data) if whole else transform(data)
    except Exception as exc:
        log.exception("relaying the engine's answer failed")
        transform.error = f"relay failed: {exc!r}"
        transform.done = True
        raise


def _teeing(call: _Call) -> Any:
    """The call's tee as mitmproxy's stream callable, read from the call (see :func:`_release`)."""

    def stream(data: bytes) -> bytes:
        watcher = call.tee
        return watcher(data) if watcher is not None else data

    return stream


@dataclass(frozen=True, slots=True)
class _ServedModel:
    name: str
    max_model_len: int | None  # None: the engine does not say


#: The context length assumed when neither the option nor the engine gives one.
DEFAULT_MAX_MODEL_LEN = 32768


def context_length(option: int, engine: int | None) -> int:
    """The policy's context length: the option (0: unset) at most the engine's."""
    if option > 0:
        return min(option, engine) if engine is not None else option
    return engine if engine is not None else DEFAULT_MAX_MODEL_LEN


def _served_model(engine_url: str) -> _ServedModel:
    """The engine's first model and its context length, from its OpenAI-style ``/v1/models``.

    vLLM and ``openforge serve`` give ``max_model_len`` on each model card.
    """
    with urllib.request.urlopen(engine_url.rstrip("/") + "/v1/models", timeout=10) as response:
        try:
            body = json.load(response)
        except ValueError as exc:
            raise OSError(f"engine at {engine_url}: /v1/models is not JSON: {exc}") from None
    models = body.get("data") if isinstance(body, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise OSError(f"engine at {engine_url} lists no model in /v1/models")
    length = models[0].get("max_model_len")
    valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
    return _ServedModel(str(models[0]["id"]), length if valid else None)


def _json_response(status: int, body: dict[str, Any]) -> http.Response:
    return http.Response.make(
        status, json.dumps(body).encode(), {"content-type": "application/json"}
    )


def _response_id(codec: Codec, index: int) -> str:
    prefix = {
        "openai_chat": "chatcmpl",
        "openai_responses": "resp",
        "anthropic_messages": "msg",
    }.get(codec.api.value, "gen")
    return f"{prefix}_{uuid.uuid4().hex[:24]}{index:04d}"
