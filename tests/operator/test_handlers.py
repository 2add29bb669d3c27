"""The kopf wiring: which handlers are registered, and the daemon's filter."""

from __future__ import annotations

from openforge_operator import handlers, settings, webhook


def runtime(**kwargs: object) -> handlers.Runtime:
    return handlers.Runtime(config=settings.Settings(), namespaces=["rl"], **kwargs)  # type: ignore[arg-type]


def test_the_registry_has_the_jobs_daemon_the_index_and_the_event_handlers() -> None:
    registry = handlers.build_registry(runtime())
    assert [h.id for h in registry._spawning.get_all_handlers()] == ["rollout-job"]
    assert [h.id for h in registry._indexing.get_all_handlers()] == [handlers.ENV_INDEX]
    assert {h.id for h in registry._watching.get_all_handlers()} == {
        "harness-env-ready",
        "rollout-job-wakeup",
    }
    assert registry._changing.get_all_handlers() == [], (
        "no create/update handlers: kopf stores no progress on our objects"
    )
    assert registry._webhooks.get_all_handlers() == []


def resource(handler: object) -> str | None:
    selector = getattr(handler, "selector", None)
    return None if selector is None else selector.plural or selector.any_name


def test_kopf_never_handles_pods() -> None:
    registry = handlers.build_registry(runtime(webhook=webhook.WebhookOptions()))
    watched = {
        resource(h)
        for kind in (registry._spawning, registry._indexing, registry._watching, registry._changing)
        for h in kind.get_all_handlers()
    }
    assert watched == {"rolloutjobs", "harnessenvs"}
    [hook] = registry._webhooks.get_all_handlers()
    assert hook.id == webhook.HANDLER_ID and hook.ignore_failures and resource(hook) == "pods"
    assert hook.operations == ["CREATE"]


def test_a_finished_job_without_ttl_gets_no_loop() -> None:
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}, "spec": {}}
    assert handlers.finished_without_ttl(complete)
    assert not handlers.finished_without_ttl({**complete, "spec": {"ttlSecondsAfterFinished": 60}})
    assert not handlers.finished_without_ttl(
        {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}, "spec": {}}
    )
    assert not handlers.finished_without_ttl({"spec": {}})
