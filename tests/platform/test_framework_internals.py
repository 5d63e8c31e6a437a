"""The frameworks' private internals parley leans on, each checked for the shape parley uses.

docs/development.md ("Framework internals") lists them, with the code that uses each and the way
out. A failure here means an upgrade changed one: read the message, then the code it names,
before anything else. These check shapes and source; the behaviour each one gives parley is
tested beside its code (tests/studies/lib/test_prepared.py, tests/platform/test_asgi_handler.py,
tests/studies/chat, tests/agents/serving/test_weights.py).
"""

import inspect
import uuid

import pytest


def changed(what: str, user: str, way_out: str = "") -> str:
    return (
        f"{what} changed shape: {user} leans on it (docs/development.md, Framework internals)."
        + (f" Until it is updated: {way_out}" if way_out else "")
    )


COMPILED = ("studies/lib/prepared_queries.py", "set PARLEY_COMPILED_READS=0")


def test_django_compiler_as_compiled_reads_use_it(db):
    """Prepared compiles a queryset, keeps its SQL and converters and builds instances as
    Django's ModelIterable does."""
    from django.db import connection
    from django.db.models.query import ModelIterable, QuerySet, get_related_populators
    from django.db.models.sql.compiler import SQLCompiler

    from studies.models import Participant

    queryset = Participant.objects.select_related("study").filter(pk=1)
    assert queryset._iterable_class is ModelIterable, changed("QuerySet._iterable_class", *COMPILED)
    assert queryset._prefetch_related_lookups == (), changed(
        "QuerySet._prefetch_related_lookups", *COMPILED
    )
    compiler = queryset.query.get_compiler(using=connection.alias)
    sql, params = compiler.as_sql()
    assert isinstance(sql, str) and 1 in params, changed("SQLCompiler.as_sql", *COMPILED)
    info = compiler.klass_info
    assert info["model"] is Participant and "select_fields" in info, changed(
        "SQLCompiler.klass_info", *COMPILED
    )
    first = compiler.select[info["select_fields"][0]]
    assert first[0].target.attname == "id", changed("SQLCompiler.select", *COMPILED)
    assert isinstance(compiler.annotation_col_map, dict), changed(
        "SQLCompiler.annotation_col_map", *COMPILED
    )
    results_iter = inspect.signature(SQLCompiler.results_iter).parameters
    assert {"results", "tuple_expected"} <= set(results_iter), changed(
        "SQLCompiler.results_iter", *COMPILED
    )
    assert list(inspect.signature(get_related_populators).parameters) == [
        "klass_info",
        "select",
        "db",
    ], changed("django.db.models.query.get_related_populators", *COMPILED)
    assert QuerySet.__init__  # public; the rest above is not


def test_a_uuid_is_sent_as_this_backend_sends_it(db):
    """The forms studies/lib/prepared_queries.py FORMS lists for a UUID: the backend's own."""
    from django.db import connection

    from studies.lib.prepared_queries import FORMS
    from studies.models import Participant

    token = uuid.UUID(int=12345)
    field = Participant._meta.get_field("token")
    sent = field.get_db_prep_value(token, connection)
    assert any(
        form(token) == sent and type(form(token)) is type(sent) for form in FORMS[uuid.UUID]
    ), changed(f"UUIDField.get_db_prep_value on {connection.vendor} ({sent!r})", *COMPILED)


def test_django_asgi_handler_as_the_one_hop_handler_uses_it():
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.base import BaseHandler

    user = "platform/parley/http.py (OneHopASGIHandler)", "set PARLEY_ONE_HOP_HTTP=0"
    assert list(inspect.signature(ASGIHandler.handle).parameters) == [
        "self",
        "scope",
        "receive",
        "send",
    ], changed("ASGIHandler.handle", *user)
    assert list(inspect.signature(ASGIHandler.get_response_async).parameters) == [
        "self",
        "request",
    ], changed("ASGIHandler.get_response_async", *user)
    assert "is_async" in inspect.signature(BaseHandler.load_middleware).parameters, changed(
        "BaseHandler.load_middleware", *user
    )
    # Django's own __init__ loads the async chain; ours replaces exactly that one line.
    source = inspect.getsource(ASGIHandler.__init__)
    assert "self.load_middleware(is_async=True)" in source, changed("ASGIHandler.__init__", *user)
    assert len([line for line in source.splitlines() if line.strip()]) == 3, changed(
        "ASGIHandler.__init__ (it does more now)", *user
    )


def test_asgiref_thread_sensitive_context_takes_an_executor():
    from asgiref.sync import ThreadSensitiveContext

    assert "executor" in inspect.signature(ThreadSensitiveContext.__init__).parameters, changed(
        "asgiref's ThreadSensitiveContext(executor=...)",
        "platform/parley/http.py",
        "set PARLEY_ONE_HOP_HTTP=0",
    )


def test_channels_dispatch_is_what_the_chat_consumer_copies():
    """ChatConsumer.dispatch is Channels' own less `aclose_old_connections` before each handler:
    if Channels' changes, the copy must follow."""
    from channels.consumer import AsyncConsumer, get_handler_name

    user = "studies/chat/consumers.py (ChatConsumer.dispatch)", "set PARLEY_LEAN_CHAT_DISPATCH=0"
    source = inspect.getsource(AsyncConsumer.dispatch)
    body = [
        line.strip()
        for line in source.split('"""')[-1].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert body == [
        "handler = getattr(self, get_handler_name(message), None)",
        "if handler:",
        "await aclose_old_connections()",
        "await handler(message)",
        "else:",
        'raise ValueError("No handler for message type %s" % message["type"])',
    ], changed("channels.consumer.AsyncConsumer.dispatch", *user)
    assert get_handler_name({"type": "websocket.receive"}) == "websocket_receive", changed(
        "channels.consumer.get_handler_name", *user
    )


def test_torch_onednn_linear_ops():
    import torch

    from agents.serving.embedded.weights import PACK_HINT, can_pack

    if not can_pack():
        pytest.skip("this torch has no oneDNN: the engine keeps plain weights")
    user = "agents/serving/embedded/weights.py (PackedLinear)", "set PARLEY_ENGINE_PACKED_WEIGHTS=0"
    weight, x = torch.randn(8, 16), torch.randn(3, 16)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_HINT)
    out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    assert torch.allclose(out, x @ weight.t(), atol=1e-5), changed(
        "torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise", *user
    )
