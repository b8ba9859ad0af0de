"""Admin pages of the shop (the dead letters are ``django_outbox``'s)."""

from __future__ import annotations

from django.contrib import admin

from shop.models import Notification, Order


class NotificationInline(admin.TabularInline):
    """An order's notifications, read-only."""

    model = Notification
    extra = 0
    can_delete = False
    readonly_fields = (
        "channel",
        "status",
        "attempts",
        "task_id",
        "dead_letter_id",
        "last_error",
        "created_at",
        "delivered_at",
    )


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders with their notifications."""

    list_display = ("id", "customer", "phone", "total", "batch", "created_at")
    list_filter = ("batch",)
    inlines = [NotificationInline]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    """Every channel's attempt, filterable by channel and status."""

    list_display = (
        "id",
        "order",
        "channel",
        "status",
        "attempts",
        "delivered_at",
        "dead_letter_id",
    )
    list_filter = ("channel", "status")
    search_fields = ("task_id",)
    readonly_fields = (
        "order",
        "channel",
        "status",
        "attempts",
        "task_id",
        "dead_letter_id",
        "last_error",
        "created_at",
        "delivered_at",
    )
