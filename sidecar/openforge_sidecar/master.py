"""The mitmproxy that ``openforge sidecar`` runs: mitmdump's proxy, with only the addons it uses.

``mitmdump`` starts 35 addons. Every flow event (four per model call, each
followed by an ``update`` event) is offered to every one of them, and
importing ``mitmproxy.addons`` imports all their modules, flask for the
mitm.it onboarding app and ldap3 for proxy authentication among them. The
sidecar needs few, so it builds its own master from mitmproxy's parts with
these, in mitmdump's order (the capture addon where mitmdump runs scripts):

=================  ==============================================================
``core``           option checks, core commands
``block``          refuses clients from public addresses (``block_global``)
``disable_h2c``    strips h2c upgrade requests
``proxyserver``    the listening servers and their connection handlers
(capture addon)    :class:`openforge_sidecar.capture.Capture`, its connection guard
                   (:mod:`openforge_sidecar.guard`), then any extras
``next_layer``     which protocol layer each connection gets
``tlsconfig``      certificates for intercepted TLS (the CA in ``confdir``), as
                   :mod:`openforge_sidecar.tlsstore`: the CA loaded once, when used
``update_alt_svc`` rewrites ``Alt-Svc`` headers in reverse mode
``dumper``         prints each flow, with ``--verbose`` only
``errorcheck``     exits with status 1 when an error was logged during startup
=================  ==============================================================

plus mitmproxy's terminal log. What is left out does nothing in the sidecar:
features behind options it never sets (anticache, map and modify rules,
replay, saving flows, sticky cookies, proxy and upstream authentication),
the mitm.it onboarding app, commands for the interactive tools, reading
flows from stdin, DNS mode. Options come from the command line only (no
``config.yaml`` from the confdir). The capture addon itself stays an
ordinary addon: ``mitmdump -s sidecar/openforge_sidecar/addon.py`` runs it
with all of mitmdump's addons.

Events are dispatched through a table (:class:`HookTable`): mitmproxy's
addon manager looks every event's hook up on every addon, each in its own
error guard, and follows each flow event with an ``update`` event that none
of these addons handles; the table offers an event only to the addons that
have its hook, in the same order and with the same error handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.util
import inspect
import logging
import signal
import socket
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mitmproxy import addonmanager, exceptions, flow, hooks

from openforge_sidecar import capture, guard

#: The modules of ``mitmproxy.addons`` that :func:`build` imports (``dumper`` only with
#: ``verbose``: it imports mitmproxy's content views, 40 ms of every pod's start).
ADDON_MODULES = (
    "core",
    "block",
    "disable_h2c",
    "proxyserver",
    "next_layer",
    "update_alt_svc",
    "errorcheck",
)


class StartupError(Exception):
    """An option was refused; the message names it."""


def run(
    settings: Sequence[str],
    *,
    verbose: bool,
    extra_addons: Sequence[Any] = (),
    listening: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT. ``settings`` are mitmproxy options as ``name=value``.

    ``listening``: a socket already listening on the proxy's address, served instead of
    binding a new one (see :func:`serving_from`).
    """
    asyncio.run(_serve(settings, verbose=verbose, extra_addons=extra_addons, listening=listening))


async def _serve(
    settings: Sequence[str],
    *,
    verbose: bool,
    extra_addons: Sequence[Any],
    listening: socket.socket | None,
) -> None:
    # As mitmproxy's own entry point does: its log handlers filter by level.
    logging.getLogger().setLevel(logging.DEBUG)
    for name in ("asyncio", "hpack", "quic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    master = build(settings, verbose=verbose, extra_addons=extra_addons)
    settle_garbage_collector()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, master.shutdown)
    loop.add_signal_handler(signal.SIGTERM, master.shutdown)
    with serving_from(listening):
        await master.run()


@contextlib.contextmanager
def serving_from(listening: socket.socket | None) -> Iterator[None]:
    """While inside, the proxy server that listens on ``listening``'s address serves it.

    A rollout pod's agent binds the sidecar's port first thing, before the
    imports (half a second of CPU), and lets the harness start: its first
    connections wait in the socket's backlog instead of being refused, and the
    harness's own start-up overlaps the sidecar's. mitmproxy binds its servers
    itself (``asyncio.start_server(handler, host, port)``); inside this context
    its TCP server for that host and port is started on the given socket
    instead (``start_server(handler, sock=...)``), once. ``None``: nothing changes.
    """
    if listening is None:
        yield
        return
    from mitmproxy.proxy import mode_servers

    original = mode_servers.AsyncioServerInstance.listen
    address = listening.getsockname()[:2]
    unclaimed = [listening]

    async def listen(self: Any, host: str, port: int) -> list[Any]:
        if unclaimed and self.mode.transport_protocol == "tcp" and (host, port) == address:
            return [await asyncio.start_server(self.handle_stream, sock=unclaimed.pop())]
        return await original(self, host, port)

    mode_servers.AsyncioServerInstance.listen = listen  # type: ignore[method-assign]
    try:
        yield
    finally:
        mode_servers.AsyncioServerInstance.listen = original  # type: ignore[method-assign]
        if unclaimed:
            unclaimed.pop().close()


#: Allocations (net of deallocations) of container objects between two
#: youngest-generation collections; Python's default is 700.
GC_YOUNG_THRESHOLD = 2000


def settle_garbage_collector() -> None:
    """Keep the cyclic garbage collector off what startup built, and run it less often.

    Everything alive once the master is built (modules, classes, mitmproxy's
    and our state: ~67k objects) lives as long as the process, yet every
    full collection walks it again. ``gc.freeze`` moves it out of the
    collector's generations for good. Each model call allocates thousands of
    container objects (flows, layers, parsed JSON), nearly all freed by
    reference counting; collecting the youngest generation every 2000 net
    allocations instead of 700 walks the objects of the calls in flight less
    often. Measured under the proxy-overhead workload (1200 calls, half of
    them from 50 concurrent clients; CPU time inside the collector on the
    event-loop thread): 0.18 ms per call by default, 0.12 with the freeze,
    0.09 with the freeze and this threshold.

    Nothing is collected first: the imports leave ~2,400 objects of garbage,
    frozen with the rest (a few hundred KB), where a full collection of the
    ~66k would cost every rollout pod 65 ms before it serves. The collector
    is enabled here: a rollout pod's agent disables it for the imports
    (0.1 s less of them).
    """
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)
    gc.enable()


def build(settings: Sequence[str], *, verbose: bool, extra_addons: Sequence[Any] = ()) -> Any:
    """The master with the capture addon, configured with ``settings``.

    Call it with the event loop running (mitmproxy's master needs one).
    Raises :class:`StartupError` when an option is unknown or refused.
    """
    _addons_package_without_its_init()
    from mitmproxy import master, options

    parts = {name: importlib.import_module(f"mitmproxy.addons.{name}") for name in ADDON_MODULES}
    built = master.Master(options.Options(), with_termlog=True)
    # The manager is already wired to the options (and holds the terminal
    # log): it keeps its state and gets the table's dispatch.
    built.addons.__class__ = HookTable
    manager: Any = built.addons  # AddonManager's methods are untyped
    capturing = capture.Capture()
    ours = [capturing, guard.ConnectionGuard(capturing.stats), *extra_addons]
    try:
        # An addon's options exist once it is added; until then they wait.
        built.options.set(*settings, defer=True)
        manager.add(
            parts["core"].Core(),
            parts["block"].Block(),
            parts["disable_h2c"].DisableH2C(),
            parts["proxyserver"].Proxyserver(),
            *ours,
            parts["next_layer"].NextLayer(),
            importlib.import_module("openforge_sidecar.tlsstore").TlsConfig(),
            parts["update_alt_svc"].UpdateAltSvc(),
        )
        if verbose:
            manager.add(importlib.import_module("mitmproxy.addons.dumper").Dumper())
        manager.add(parts["errorcheck"].ErrorCheck())
        if built.options.deferred:
            raise StartupError(
                f"unknown mitmproxy options: {', '.join(sorted(built.options.deferred))}"
            )
        # What mitmdump does once its addons are in: every addon configured
        # with the options given on the command line (this checks the proxy
        # modes and sets up transparent mode; see tlsstore for the CA),
        # then, as its script loader does, our addons with every option.
        given = {setting.split("=", 1)[0] for setting in settings}
        manager.trigger(hooks.ConfigureHook(given))
        every: set[str] = set(built.options.keys())  # type: ignore[no-untyped-call]
        for addon in ours:
            manager.invoke_addon_sync(addon, hooks.ConfigureHook(every))
    except exceptions.OptionsError as exc:
        raise StartupError(str(exc)) from exc
    return built


_Hook = Callable[..., Any]


class HookTable(addonmanager.AddonManager):
    """mitmproxy's addon manager, offering each event only to the addons that handle it.

    Per event name, the table holds for each addon in the chain (with its
    sub-addons, as mitmproxy traverses them) the hook functions it has,
    leaving out addons with none. It is rebuilt after the chain changes.
    Dispatch is as mitmproxy's: chain order, one error guard per chain
    addon (an exception is logged and the next addon still runs), an
    ``AddonHalt`` stops the event, awaitable results are awaited.
    """

    _table: dict[str, list[list[_Hook]]]

    def _hooks(self, name: str) -> list[list[_Hook]]:
        table = self.__dict__.setdefault("_table", {})
        found: list[list[_Hook]] | None = table.get(name)
        if found is None:
            found = [funcs for item in self.chain if (funcs := _hook_functions(item, name))]
            table[name] = found
        return found

    def _changed(self) -> None:
        self.__dict__.pop("_table", None)

    def register(self, addon: Any) -> Any:
        self._changed()
        try:
            return super().register(addon)  # type: ignore[no-untyped-call]
        finally:
            self._changed()

    def add(self, *addons: Any) -> None:
        try:
            super().add(*addons)  # type: ignore[no-untyped-call]
        finally:
            self._changed()

    def remove(self, addon: Any) -> None:
        self._changed()
        try:
            super().remove(addon)  # type: ignore[no-untyped-call]
        finally:
            self._changed()

    def clear(self) -> None:
        try:
            super().clear()  # type: ignore[no-untyped-call]
        finally:
            self._changed()

    async def handle_lifecycle(self, event: hooks.Hook) -> None:
        await self.trigger_event(event)
        if self._hooks("update"):
            message = event.args()[0]
            if isinstance(message, flow.Flow):
                await self.trigger_event(hooks.UpdateHook([message]))

    async def trigger_event(self, event: hooks.Hook) -> None:
        found = self._hooks(event.name)
        if not found:
            return
        args = event.args()
        for funcs in found:
            try:
                with addonmanager.safecall():
                    for func in funcs:
                        result = func(*args)
                        if result is not None and inspect.isawaitable(result):
                            await result
            except exceptions.AddonHalt:
                return


def _hook_functions(addon: Any, name: str) -> list[_Hook]:
    """The ``name`` hooks of an addon and its sub-addons, as mitmproxy's manager finds them."""
    found: list[_Hook] = []
    for item in addonmanager.traverse([addon]):  # type: ignore[no-untyped-call]
        func = getattr(item, name, None)
        if not func or isinstance(func, types.ModuleType):
            continue  # a module imported under a hook's name is no hook, as in mitmproxy
        if not callable(func):
            found.append(_not_callable(name, item))
        else:
            found.append(func)
    return found


def _not_callable(name: str, item: Any) -> _Hook:
    def fail(*_: Any) -> None:
        raise exceptions.AddonManagerError(f"Addon handler {name} ({item}) not callable")  # type: ignore[no-untyped-call]

    return fail


def _addons_package_without_its_init() -> None:
    """Make ``mitmproxy.addons`` a package whose ``__init__`` has not run.

    That ``__init__`` imports every addon module to list mitmdump's default
    addons: about 16 MB resident, a sixth of the sidecar, for modules it
    never uses. A module made from the package's import spec, but not
    executed, has the package's ``__path__``, so the submodules named in
    :func:`build` import from it as usual and nothing else is loaded. When
    the package was imported already (a test process), it is left alone.
    """
    if "mitmproxy.addons" in sys.modules:
        return
    import mitmproxy

    spec = importlib.util.find_spec("mitmproxy.addons")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("mitmproxy.addons is not a package in this mitmproxy")
    package = importlib.util.module_from_spec(spec)
    sys.modules["mitmproxy.addons"] = package
    mitmproxy.addons = package  # as importing a submodule sets it on its parent
