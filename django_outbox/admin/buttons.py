"""Buttons on a row's own admin page, each doing what the list action of the same purpose
does, to that one row.

A button is a small POST form carrying the CSRF token (``<object id>/act/<name>/``), shown
only when the user holds its permission (the admin's ``has_<permission>_permission``, as
for the list's actions) and the row is in a state it applies to. The view checks the
permission again, so a forged POST without it is refused (403), as is one without the
CSRF token (the admin's ``csrf_protect``) or a GET (405). It then runs the list action on
the one-row queryset: the same logic, the same reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import URLPattern, path, reverse
from django.utils.functional import Promise

from django_outbox.admin.base import ReadOnlyAdmin


@dataclass(frozen=True, kw_only=True)
class RowAction:
    """A button of a row's page.

    ``run`` names the admin's list action (``(request, queryset) -> None``) it runs;
    ``permission`` its ``has_<permission>_permission``; ``applies`` whether a row's state
    calls for it; ``confirm``, when set, is asked in the browser before posting
    (``django_outbox/confirm.js``; without JavaScript the button posts at once).
    """

    name: str
    label: str | Promise
    run: str
    permission: str
    applies: Callable[[Any], bool]
    confirm: str | Promise = ""


class RowActionsAdmin(ReadOnlyAdmin):
    """A read-only admin whose change page shows its :attr:`row_actions` as buttons."""

    #: The buttons, in page order.
    row_actions: tuple[RowAction, ...] = ()
    change_form_template = "admin/django_outbox/row_actions_change_form.html"

    class Media:
        # The confirmation before a button with ``confirm``: a static script reading the
        # button's data-confirm, as a Content-Security-Policy of script-src 'self' allows
        # (it refuses an inline onclick).
        js = ("django_outbox/confirm.js",)

    def get_urls(self) -> list[URLPattern]:
        """The admin's URLs, after ``<id>/act/<name>/`` (before its catch-all)."""
        name = f"{self.opts.app_label}_{self.opts.model_name}_row_action"
        view = self.admin_site.admin_view(self.row_action_view)
        own = [path("<path:object_id>/act/<str:action>/", view, name=name)]
        return own + list(super().get_urls())

    def allowed_row_actions(self, request: HttpRequest, row: Any) -> list[RowAction]:
        """The buttons ``request``'s user may press on ``row`` in its present state."""
        return [a for a in self.row_actions if self._permitted(request, a) and a.applies(row)]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The read-only page, with the buttons the user may press."""
        row = self.get_object(request, unquote(object_id))
        buttons = [] if row is None else self._buttons(request, row)
        context = {**(extra_context or {}), "outbox_row_actions": buttons}
        return super().change_view(request, object_id, form_url, context)

    def row_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Run button ``action`` on the row, then go back to its page (or to the list, when
        the action removed it).
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        found = [a for a in self.row_actions if a.name == action]
        if not found:
            raise Http404(f"no button {action!r}")
        if not self._permitted(request, found[0]):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))
        if row is None:
            raise Http404(f"no {self.opts.verbose_name} {object_id!r}")
        rows = self.get_queryset(request).filter(pk=row.pk)
        getattr(self, found[0].run)(request, rows)
        if rows.exists():
            return redirect(self._url("change", quote(row.pk)))
        return redirect(self._url("changelist"))

    def _permitted(self, request: HttpRequest, action: RowAction) -> bool:
        allowed: bool = getattr(self, f"has_{action.permission}_permission")(request)
        return allowed and self.has_view_permission(request)

    def _buttons(self, request: HttpRequest, row: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": action.name,
                "label": action.label,
                "confirm": action.confirm,
                "url": self._url("row_action", quote(row.pk), action.name),
            }
            for action in self.allowed_row_actions(request, row)
        ]

    def _url(self, view: str, *args: Any) -> str:
        name = f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{view}"
        return reverse(name, args=args)
