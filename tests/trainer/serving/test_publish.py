"""Publishers against a stub HTTP server that records every request it gets.

The stub answers ``openforge serve``'s weights API as its protocol says and
vLLM's dev-mode endpoints with what vLLM answers; what is checked is the
requests our publishers send. No real vLLM runs here (no GPU).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
from openforge import endpoints
from openforge_trainer.collection import store
from openforge_trainer.serving import publish, vllm_worker
from openforge_trainer.training import checkpoint, rollout_sampler
from openforge_trainer.training import config as train_config
from openforge_trainer.training import loop as trainer_loop

torch.set_num_threads(1)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = Callable[[Seen], tuple[int, dict[str, Any]]]


@dataclass
class Stub:
    url: str
    seen: list[Seen] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)


def serve_answer(seen: Seen) -> tuple[int, dict[str, Any]]:
    if seen.headers.get("content-type") == "application/json":
        version = seen.json()["policy_version"]
    else:
        version = int(seen.headers[endpoints.POLICY_VERSION_HEADER])
    return 200, {"policy_version": version, "load_ms": 1.5}


def ok(message: str) -> Answer:
    return lambda seen: (200, {"status": message})


@pytest.fixture
def stub() -> Iterator[Stub]:
    record = Stub(url="")

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length", 0))
            seen = Seen(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length),
            )
            record.seen.append(seen)
            answer = record.answers.get(self.path.split("?")[0])
            status, body = answer(seen) if answer else (404, {"detail": "Not Found"})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _handle

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    record.url = f"http://127.0.0.1:{server.server_address[1]}"
    record.answers = {
        endpoints.WEIGHTS: serve_answer,
        endpoints.POLICY: lambda seen: (200, {"model": "tiny", "policy_version": 7}),
        "/pause": ok("paused"),
        "/collective_rpc": lambda seen: (200, {"results": [{"loaded": 24}, {"loaded": 24}]}),
        "/update_weight_version": lambda seen: (200, {"success": True}),
        "/resume": ok("resumed"),
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield record
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("publish")
    model_dir = rollout_sampler.build_tiny_model(base / "model")
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    return checkpoint.save(
        base / "run",
        state=checkpoint.TrainerState(step=3, policy_version=3),
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        assets_from=model_dir,
        keep=1,
    )


def test_serve_publisher_sends_the_checkpoint_path(stub: Stub, saved: Path) -> None:
    result = publish.ServePublisher(stub.url).publish(saved, 3)
    assert (result.ok, result.kind, result.policy_version, result.detail) == (
        True,
        "serve",
        3,
        "load_ms=1.5",
    )
    (seen,) = stub.seen
    assert (seen.method, seen.path, seen.headers["content-type"]) == (
        "POST",
        "/openforge/v1/weights",
        "application/json",
    )
    assert seen.json() == {"path": str(saved.resolve()), "policy_version": 3}
    assert publish.ServePublisher(stub.url).policy() == {"model": "tiny", "policy_version": 7}


def test_serve_publisher_bytes_mode_sends_the_safetensors_state_dict(
    stub: Stub, saved: Path
) -> None:
    result = publish.ServePublisher(stub.url, mode="bytes").publish(saved, 4)
    assert result.ok
    (seen,) = stub.seen
    assert seen.headers["content-type"] == "application/octet-stream"
    assert seen.headers[endpoints.POLICY_VERSION_HEADER] == "4"
    assert seen.body == (saved / "model.safetensors").read_bytes()


def test_serve_publish_failures_are_reported_not_raised(stub: Stub, saved: Path) -> None:
    stub.answers[endpoints.WEIGHTS] = lambda seen: (200, {"policy_version": 2, "load_ms": 1})
    wrong = publish.ServePublisher(stub.url).publish(saved, 3)
    assert not wrong.ok and "reports policy_version 2 after loading 3" in wrong.detail
    stub.answers[endpoints.WEIGHTS] = lambda seen: (409, {"error": "shape mismatch: lm_head"})
    refused = publish.ServePublisher(stub.url).publish(saved, 3)
    assert (
        not refused.ok
        and "HTTP 409" in refused.detail
        and "shape mismatch: lm_head" in refused.detail
    )
    unreachable = publish.ServePublisher("http://127.0.0.1:1", timeout=2).publish(saved, 3)
    assert not unreachable.ok and "Connection refused" in unreachable.detail


def test_vllm_publisher_pauses_loads_on_every_worker_and_resumes(stub: Stub, saved: Path) -> None:
    result = publish.VLLMPublisher(stub.url, timeout=60, set_weight_version=True).publish(saved, 5)
    assert (result.ok, result.kind, result.detail) == (True, "vllm", "2 workers loaded")
    assert [(s.method, s.path) for s in stub.seen] == [
        ("POST", "/pause?mode=wait"),
        ("POST", "/collective_rpc"),
        ("POST", "/update_weight_version"),
        ("POST", "/resume"),
    ]
    assert stub.seen[1].json() == {
        "method": "update_weights_from_path",
        "args": [str(saved.resolve())],
        "timeout": 60,
    }
    assert stub.seen[2].json() == {"new_version": "5"}


def test_a_failed_vllm_load_leaves_the_server_paused(stub: Stub, saved: Path) -> None:
    stub.answers["/collective_rpc"] = lambda seen: (500, {"error": "worker 1: missing tensor"})
    result = publish.VLLMPublisher(stub.url).publish(saved, 5)
    assert not result.ok and "missing tensor" in result.detail and "left paused" in result.detail
    assert [s.path for s in stub.seen] == ["/pause?mode=wait", "/collective_rpc"]


def test_publish_all_reaches_every_server(stub: Stub, saved: Path) -> None:
    publishers: list[publish.Publisher] = [
        publish.ServePublisher(stub.url),
        publish.VLLMPublisher(stub.url),
    ]
    results = publish.publish_all(publishers, saved, policy_version=6)
    assert [(r.kind, r.ok) for r in results] == [("serve", True), ("vllm", True)]
    assert sorted(s.path for s in stub.seen) == sorted(
        ["/openforge/v1/weights", "/pause?mode=wait", "/collective_rpc", "/resume"]
    )


def test_the_trainer_publishes_each_step_and_again_on_resume(stub: Stub, tmp_path: Path) -> None:
    model_dir = rollout_sampler.build_tiny_model(tmp_path / "model")
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    with store.Store(tmp_path / "store.db") as db:
        rollout_sampler.write_rollouts(db, model, job="job", tasks=["a", "b"], samples=2)
    config = train_config.load(
        store=tmp_path / "store.db",
        job="job",
        model=model_dir,
        run_dir=tmp_path / "run",
        groups_per_step=1,
        steps=1,
        wait_for_groups=0,
        serve_urls=[stub.url],
        vllm_urls=[stub.url],
    )
    lines: list[str] = []
    run = trainer_loop.Trainer.open(config, log=lines.append)
    run.run()
    run.close()
    first = checkpoint.path_for(config.run_dir, 1)
    weights = [s.json() for s in stub.seen if s.path == endpoints.WEIGHTS]
    assert weights == [{"path": str(first.resolve()), "policy_version": 1}]
    assert [s.json()["args"] for s in stub.seen if s.path == "/collective_rpc"] == [
        [str(first.resolve())]
    ]
    assert "published 2/2" in lines[-1]
    stub.seen.clear()
    resumed = trainer_loop.Trainer.open(config.model_copy(update={"steps": 2}), log=lines.append)
    resumed.run()
    resumed.close()
    weights = [s.json() for s in stub.seen if s.path == endpoints.WEIGHTS]
    second = checkpoint.path_for(config.run_dir, 2)
    assert weights == [
        {"path": str(first.resolve()), "policy_version": 1},  # servers catch up on restart
        {"path": str(second.resolve()), "policy_version": 2},
    ]


def test_the_vllm_worker_extension_reads_every_checkpoint_tensor(saved: Path) -> None:
    """The half of the vLLM worker extension that runs without vLLM: reading the checkpoint."""
    from safetensors.torch import load_file

    expected = load_file(saved / "model.safetensors")
    read = dict(vllm_worker.checkpoint_weights(saved))
    assert read.keys() == expected.keys() and "model.embed_tokens.weight" in read
    assert all(torch.equal(read[name], expected[name]) for name in expected)
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        list(vllm_worker.checkpoint_weights(saved.parent))


def test_the_trainer_config_picks_the_serve_publish_mode() -> None:
    """serve_publish=bytes (the chart's setting: the policy server is another pod) reaches the
    publishers; the default names the checkpoint path, for servers that see the trainer's files."""
    base = {
        "store": "s.db",
        "job": "j",
        "model": "m",
        "run_dir": "r",
        "serve_urls": ["http://a:1", "http://b:2"],
    }
    default = trainer_loop.default_publishers(train_config.TrainConfig(**base))
    chosen = trainer_loop.default_publishers(
        train_config.TrainConfig(**base, serve_publish="bytes")
    )
    assert [p.mode for p in default] == ["path", "path"]  # type: ignore[attr-defined]
    assert [p.mode for p in chosen] == ["bytes", "bytes"]  # type: ignore[attr-defined]
    with pytest.raises(pydantic.ValidationError, match="serve_publish"):
        train_config.TrainConfig(**base, serve_publish="nfs")
