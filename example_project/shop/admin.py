"""Admin pages of the shop (the dead letters are ``django_outbox``'s)."""

from __future__ import annotations

from django.contrib import admin

from shop.models import Notification, Order, OrderItem, Shipment


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


class OrderItemInline(admin.TabularInline):
    """An order's items, with what their ``pack_item`` step did (read-only)."""

    model = OrderItem
    extra = 0
    can_delete = False
    readonly_fields = ("sku", "packings", "packed_at")


class ShipmentInline(admin.TabularInline):
    """An order's shipment, written by its fulfilment's ``ship`` step (read-only)."""

    model = Shipment
    extra = 0
    can_delete = False
    readonly_fields = ("tracking", "packed_items", "retries", "shipped_at")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders with their items, shipment and notifications."""

    list_display = ("id", "customer", "phone", "total", "batch", "fulfilment_id", "created_at")
    list_filter = ("batch",)
    search_fields = ("fulfilment_id",)
    inlines = [OrderItemInline, ShipmentInline, NotificationInline]


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
