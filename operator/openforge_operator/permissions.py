"""The RBAC rules the operator needs: exactly what it uses, nothing more.

The Helm chart's (Cluster)Role is checked against these lists, and the
end-to-end tests run the operator under a service account bound to exactly
:data:`RULES`, so a call the operator makes without a rule here fails there.

What each rule is for:

- ``rolloutjobs``: list + watch (kopf's watch stream feeding the per-job
  reconcile loop), get (whether the job of a held pod being deleted still
  plans from it: ``release.Orphans``), patch (kopf adds and removes its finalizer, which holds a
  job until its reconcile loop has stopped), delete (``ttlSecondsAfterFinished``).
- ``harnessenvs``: list + watch (kopf's index of HarnessEnvs by name; the
  reconciler never GETs one).
- ``rolloutjobs/status``, ``harnessenvs/status``: patch (counts, conditions).
- ``pods``: list + watch (the one label-selected pod watch), create (rollout
  pods), patch (taking the operator's finalizer off a pod whose outcome is
  recorded), delete (live pods of a job that failed or ran past its deadline).
- ``configmaps``: get (``spec.tasks.configMapRef``), create (the per-job
  ConfigMap of rendered task files).
- ``secrets``: create (the per-job CA of Proxy and Transparent modes, and
  with ``--collector-master-key-file`` the per-job collector token). The
  operator never reads a Secret: the token Secret a job names, like those it
  made, is mounted by the kubelet, not read by the operator; its master key
  comes from a file.
- ``networkpolicies``: create + patch (the per-job egress policy, patched when
  the policy endpoint or the HarnessEnv's allowed hosts change).
- ``events``: create (the operator's own Events; kopf's event posting is off).

The operator runs kopf with resource scanning disabled and a fixed namespace
list (or cluster-wide), so kopf needs no list/watch on
``customresourcedefinitions`` or ``namespaces``. With ``--standalone`` (what
the chart runs: one replica, ``strategy: Recreate``) kopf needs no peering
objects; without it, add :data:`PEERING_RULES` (and install kopf's peering
CRDs). With ``--webhook``, add :data:`WEBHOOK_RULES`.
"""

from __future__ import annotations

from typing import Any

GROUP = "openforge.dev"

RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [GROUP],
        "resources": ["rolloutjobs"],
        "verbs": ["get", "list", "watch", "patch", "delete"],
    },
    {"apiGroups": [GROUP], "resources": ["harnessenvs"], "verbs": ["list", "watch"]},
    {
        "apiGroups": [GROUP],
        "resources": ["rolloutjobs/status", "harnessenvs/status"],
        "verbs": ["patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["create", "patch"],
    },
]
"""Rules for ``openforge operator --standalone`` (namespaced or cluster-wide alike)."""

WEBHOOK_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "verbs": ["create", "patch"],
    },
]
"""Extra rules with ``--webhook``: kopf creates its webhook configurations if they are
absent and patches their webhooks and CA bundle (cluster-scoped objects, so these go
in a ClusterRole even when the operator serves one namespace). Kopf manages a
mutating and a validating configuration of the same name together; the validating
one stays empty (the operator registers no validating handler), but without the
rule kopf retries creating it and logs errors."""

PEERING_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["list", "watch", "patch"]},
    {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "verbs": ["list", "watch", "patch"],
    },
]
"""Extra rules without ``--standalone``: kopf's peering objects (namespaced ones when
serving namespaces, the cluster one with ``--all-namespaces``), through which
several operator replicas agree which one acts."""


def rules(*, webhook: bool = False, peering: bool = False) -> list[dict[str, Any]]:
    """The rules for one way of running the operator."""
    return [*RULES, *(WEBHOOK_RULES if webhook else []), *(PEERING_RULES if peering else [])]
