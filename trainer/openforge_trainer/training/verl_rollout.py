"""veRL's ``external`` rollout: the policy is served outside veRL, and veRL publishes to it.

veRL's trainer insists on owning a rollout engine (vLLM, SGLang or
TensorRT-LLM) colocated with its actor. With OpenForge the harnesses call the
policy through their sidecars, on servers OpenForge runs (``openforge
serve``, or vLLM); veRL only trains. This rollout is veRL's hook for that:

* :class:`ExternalRollout` lives in every actor worker (veRL's hybrid
  engine). After each step veRL hands it the full parameters, one tensor at a
  time; every rank walks the generator (the FSDP gathers are collectives), and
  rank 0 writes them to a checkpoint directory and publishes it through the
  OpenForge publishers with ``policy_version`` = veRL's global step (the
  weights after step *s* are version *s*, as in ``openforge train``).
* :class:`ExternalReplica` is the replica veRL's server manager launches: it
  launches nothing and reports the servers' addresses.

Options, under ``actor_rollout_ref.rollout.custom.openforge`` (checked by
:func:`options`, which names the key at fault)::

    publish:           # the servers to publish to (none: weights stay in veRL)
      - {url: http://127.0.0.1:8000, kind: serve, mode: path}
      - {url: http://vllm-0:8000, kind: vllm}
    weights_dir: /data/openforge/verl-weights   # where rank 0 writes each version
    keep: 2            # versions kept on disk (the servers may still be loading one)

Each version is a directory ``weights_dir/policy-{step}/model.safetensors``
(written whole, then renamed); the last ``keep`` are kept, and every publish's
result is a line of ``weights_dir/publishes.jsonl``. A publish that fails is
logged and recorded, never raised, as in ``openforge train``: ``openforge
serve`` keeps serving the old version and the rollouts say so (a vLLM server
whose load failed stays paused, as ``VLLMPublisher`` says). A weight sync
veRL makes without a step (outside training) publishes nothing. LoRA adapters
are refused (merge them: ``actor_rollout_ref.model.lora.merge=true``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import torch
from safetensors.torch import save_file
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from openforge_trainer.serving import publish as publishing

NAME = "external"
SINGLE_FILE = "model.safetensors"
log = logging.getLogger(__name__)

RESULTS_FILE = "publishes.jsonl"  # one line per publish, in weights_dir


class OptionsError(ValueError):
    """An ``actor_rollout_ref.rollout.custom.openforge`` option is wrong (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    kind: Literal["serve", "vllm"] = "serve"
    mode: Literal["path", "bytes"] = "path"  # serve only


@dataclasses.dataclass(frozen=True)
class Options:
    publish: tuple[Target, ...] = ()
    weights_dir: Path | None = None
    keep: int = 2

    def publishers(self) -> list[publishing.Publisher]:
        out: list[publishing.Publisher] = []
        for target in self.publish:
            if target.kind == "vllm":
                out.append(publishing.VLLMPublisher(target.url, set_weight_version=True))
            else:
                out.append(publishing.ServePublisher(target.url, mode=target.mode))
        return out


PREFIX = "actor_rollout_ref.rollout.custom.openforge"


def options(custom: Mapping[str, Any] | None) -> Options:
    """The rollout's options from veRL's ``rollout.custom``; unknown or bad keys are named."""
    raw = dict((custom or {}).get("openforge") or {})
    known = {"publish", "weights_dir", "keep"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise OptionsError(f"{PREFIX}.{unknown[0]}: unknown option (known: {sorted(known)})")
    targets = []
    for i, item in enumerate(raw.get("publish") or []):
        where = f"{PREFIX}.publish[{i}]"
        if not isinstance(item, Mapping) or not item.get("url"):
            raise OptionsError(f"{where}: needs a url")
        extra = sorted(set(item) - {"url", "kind", "mode"})
        if extra:
            raise OptionsError(f"{where}.{extra[0]}: unknown key (known: kind, mode, url)")
        kind, mode = item.get("kind", "serve"), item.get("mode", "path")
        if kind not in ("serve", "vllm"):
            raise OptionsError(f"{where}.kind: must be serve or vllm, got {kind!r}")
        if mode not in ("path", "bytes"):
            raise OptionsError(f"{where}.mode: must be path or bytes, got {mode!r}")
        targets.append(
            Target(
                url=str(item["url"]),
                kind=cast(Literal["serve", "vllm"], kind),
                mode=cast(Literal["path", "bytes"], mode),
            )
        )
    keep = raw.get("keep", 2)
    if not isinstance(keep, int) or keep < 1:
        raise OptionsError(f"{PREFIX}.keep: must be an integer >= 1, got {keep!r}")
    weights_dir = raw.get("weights_dir")
    if targets and not weights_dir:
        raise OptionsError(f"{PREFIX}.weights_dir: needed to publish (where rank 0 writes weights)")
    return Options(
        publish=tuple(targets),
        weights_dir=Path(weights_dir) if weights_dir else None,
        keep=keep,
    )


def version_dir(weights_dir: Path, version: int) -> Path:
    return weights_dir / f"policy-{version}"


def write_version(*, weights_dir: Path, tensors: dict[str, torch.Tensor], version: int) -> Path:
    """The tensors as ``policy-{version}/model.safetensors``, a directory (what ``openforge
    serve``, its bytes mode and the vLLM worker extension all read), complete and fsync'd
    before it is named."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    final = version_dir(weights_dir, version)
    partial = weights_dir / f".policy-{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # a failed write's leftovers
    partial.mkdir()
    target = partial / SINGLE_FILE
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(target))
    with target.open("rb") as written:
        os.fsync(written.fileno())
    shutil.rmtree(final, ignore_errors=True)  # a version written again (a restarted run)
    partial.replace(final)
    return final


def _version_of(path: Path) -> int | None:
    number = path.name.removeprefix("policy-")
    return int(number) if path.is_dir() and number.isdigit() else None


def prune(*, weights_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest versions (other files are left alone)."""
    versions = sorted(
        (version, path)
        for path in weights_dir.glob("policy-*")
        if (version := _version_of(path)) is not None
    )
    for _, old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def publish_version(
    opts: Options, *, tensors: dict[str, torch.Tensor], version: int
) -> list[publishing.PublishResult]:
    """Write one version and publish it to every target; each result logged and appended
    to ``publishes.jsonl`` (a failed publish is recorded, not raised). Nothing is written
    without targets: veRL's own checkpoints (``trainer.save_freq``) keep the weights."""
    if opts.weights_dir is None or not opts.publish:
        return []
    path = write_version(weights_dir=opts.weights_dir, tensors=tensors, version=version)
    results = publishing.publish_all(opts.publishers(), path, policy_version=version)
    with (opts.weights_dir / RESULTS_FILE).open("a") as out:
        for r in results:
            line = {**dataclasses.asdict(r), "path": str(path), "time": time.time()}
            out.write(json.dumps(line) + "\n")
            (log.info if r.ok else log.warning)(
                "publish policy %d to %s %s: %s (%s)",
                version,
                r.kind,
                r.url,
                "ok" if r.ok else "FAILED",
                r.detail,
            )
    prune(weights_dir=opts.weights_dir, keep=opts.keep)
    return results


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


class ExternalRollout(BaseRollout):
    """Receives the trained weights in each actor worker; rank 0 publishes them."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any):
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        self.options = options(self.config.custom)

    async def resume(self, tags: list[str]) -> None:
        del tags  # nothing of the policy's servers lives in this process

    async def release(self) -> None:
        pass

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"external rollout: wire_format {wire_format!r} (named_tensors only)")
        if kwargs.get("peft_config") is not None:
            # veRL then sends the base weights and the adapter apart, under one version
            raise ValueError(
                "external rollout: LoRA adapters are not published; set "
                "actor_rollout_ref.model.lora.merge=true to publish merged weights"
            )
        leader = _rank() == 0
        tensors: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, tensor in weights:  # every rank: each tensor's gather is a collective
                if leader:
                    tensors[name] = tensor.detach().to("cpu", copy=True)
        if not leader:
            return
        if global_steps is None:
            # veRL syncs without a step outside training (e.g. around validation): the
            # weights are a version already published, and version 0 they are not
            log.info("external rollout: weight sync without a step, nothing published")
            return
        # writing and HTTP off the worker's event loop
        await asyncio.to_thread(
            publish_version, self.options, tensors=tensors, version=int(global_steps)
        )


class ExternalReplica(RolloutReplica):
    """A replica whose servers run outside veRL: it reports their addresses, launches nothing."""

    async def launch_servers(self) -> None:
        targets = options(self.config.custom).publish
        self._server_address = targets[0].url if targets else f"external-{self.replica_rank}"
        self._server_handle = None  # type: ignore[assignment]  # nothing of it runs in Ray
        self.servers = []

    def rollout_worker_use_gpu(self) -> bool:
        return False


def install() -> None:
    """Register the rollout with veRL (idempotent)."""
    from verl.workers.rollout import base, replica

    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.ExternalRollout"
    replica.RolloutReplicaRegistry.register(NAME, lambda: ExternalReplica)
