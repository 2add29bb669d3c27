"""The script mitmproxy loads: ``mitmdump -s <path of this file> --set openforge_...``.

mitmproxy imports a script under a name of its own, outside ``sys.modules``,
which dataclasses cannot live in; so the addon lives in
:mod:`openforge_sidecar.capture` and this file only hands it over.
"""

from openforge_sidecar import capture, guard

_capture = capture.Capture()
addons = [_capture, guard.ConnectionGuard(_capture.stats)]
