"""veRL's ``external`` rollout: the policy is served outside veRL, and veRL publishes to it.

veRL's trainer insists on owning a rollout engine (vLLM, SGLang or
TensorRT-LLM) colocated with its actor. With OpenForge the harnesses call the
policy through their sidecars, on servers OpenForge runs (``openforge
serve``, or vLLM); veRL only trains. This rollout is veRL's hook for that:

* :class:`ExternalRollout` lives in every actor worker (veRL's hybrid
  engine). After each step veRL hands it the full parameters, one tensor at a
  time; every rank walks the generator (the FSDP gathers are collectives), and
  rank 0 writes them to one safetensors file and publishes it through the
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

A publish that fails is logged and recorded, never raised, as in ``openforge
train``: the servers keep serving the old version and the rollouts say so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from openforge_trainer.serving import publish as publishing

NAME = "external"
log = logging.getLogger(__name__)

RESULTS_FILE = "publishes.jsonl"  # one line per publish, in weights_dir


class OptionsError(ValueError):
    """An ``actor_rollout_ref.rollout.custom.openforge`` option is wrong (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    kind: str = "serve"  # serve | vllm
    mode: str = "path"  # serve only: path | bytes


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
                out.append(publishing.ServePublisher(target.url, mode=target.mode))  # type: ignore[arg-type]
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
        target = Target(
            url=str(item["url"]),
            kind=str(item.get("kind", "serve")),
            mode=str(item.get("mode", "path")),
        )
        if target.kind not in ("serve", "vllm"):
            raise OptionsError(f"{where}.kind: must be serve or vllm, got {target.kind!r}")
        if target.mode not in ("path", "bytes"):
            raise OptionsError(f"{where}.mode: must be path or bytes, got {target.mode!r}")
        targets.append(target)
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


def write_version(weights_dir: Path, tensors: dict[str, torch.Tensor], version: int) -> Path:
    """The tensors as ``policy-{version}.safetensors``, written whole before it is named."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    final = weights_dir / f"policy-{version}.safetensors"
    partial = final.with_suffix(".partial")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(partial))
    partial.replace(final)
    return final


def prune(weights_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest versions."""
    versions = sorted(
        weights_dir.glob("policy-*.safetensors"), key=lambda p: int(p.stem.split("-", 1)[1])
    )
    for old in versions[:-keep]:
        old.unlink(missing_ok=True)


def publish_version(
    opts: Options, tensors: dict[str, torch.Tensor], version: int
) -> list[dict[str, Any]]:
    """Write one version and publish it to every target; the results, also logged to disk."""
    if opts.weights_dir is None:
        return []
    path = write_version(opts.weights_dir, tensors, version)
    results = publishing.publish_all(opts.publishers(), path, version)
    lines = [dataclasses.asdict(r) for r in results]
    with (opts.weights_dir / RESULTS_FILE).open("a") as out:
        for line in lines or [{"policy_version": version, "ok": True, "url": "", "kind": "none"}]:
            out.write(json.dumps({**line, "path": str(path), "time": time.time()}) + "\n")
    for r in results:
        (log.info if r.ok else log.warning)(
            "publish policy %d to %s %s: %s (%s)",
            version,
            r.kind,
            r.url,
            "ok" if r.ok else "FAILED",
            r.detail,
        )
    prune(opts.weights_dir, opts.keep)
    return lines


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

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"external rollout: wire_format {wire_format!r} (named_tensors only)")
        leader = _rank() == 0
        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in weights:  # every rank: the gathers behind each tensor are collectives
            if leader:
                tensors[name] = tensor.detach().to("cpu", copy=True)
        if leader:
            publish_version(self.options, tensors, int(global_steps or 0))


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
