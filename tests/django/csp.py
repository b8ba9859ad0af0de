"""A strict Content-Security-Policy for the browser tests (tests only).

The header production Django sites send with django-csp or Django 6's
``ContentSecurityPolicyMiddleware`` (``SECURE_CSP``) at their strictest: every script,
style and image from the site's own origin, none inline. A browser then refuses inline
``<script>``, event-handler attributes (``onclick=``), ``<style>`` and ``style=``
attributes, and reports each refusal (the tests read it from the console).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

#: Nothing but the site's own files: no inline script or style, no ``eval``.
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: ``settings.MIDDLEWARE`` entry of :class:`StrictCSPMiddleware`.
MIDDLEWARE = "tests.django.csp.StrictCSPMiddleware"


class StrictCSPMiddleware:
    """Sets :data:`POLICY` on every response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response["Content-Security-Policy"] = POLICY
        return response
