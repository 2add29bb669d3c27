"""One spelling of each wire API: the proto enum's, the codecs' and the manifest's agree."""

from __future__ import annotations

from typing import get_args

import pytest
from openforge.api import v1alpha1
from openforge.trajectory.v1 import trajectory_pb2 as pb
from openforge.wire import codecs, conversation
from openforge.wire.conversation import WireApi

PROTO_NAMES = [value.name for value in pb.WireApi.DESCRIPTOR.values]


def test_every_proto_api_but_unspecified_is_a_wire_api_and_back() -> None:
    named = [n for n in PROTO_NAMES if n != "WIRE_API_UNSPECIFIED"]
    assert sorted(named) == sorted(api.proto_name for api in WireApi)
    for name in named:
        assert WireApi.from_proto_name(name).proto_name == name


@pytest.mark.parametrize(
    "name", ["WIRE_API_UNSPECIFIED", "OPENAI_CHAT", "openai_chat", "", "WIRE_API_"]
)
def test_any_other_name_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match=repr(name).replace("[", r"\[")):
        WireApi.from_proto_name(name)


def test_each_api_s_codec_speaks_it() -> None:
    for api in WireApi:
        assert codecs.for_api(api).api is api


def test_the_manifest_spells_each_api_with_dashes() -> None:
    assert set(get_args(v1alpha1.WireApi)) == {api.spec_name for api in WireApi}
    assert WireApi.OPENAI_CHAT.spec_name == "openai-chat"


def test_prefix_is_the_proto_enum_s() -> None:
    assert all(n.startswith(conversation.PROTO_PREFIX) for n in PROTO_NAMES)
