"""The shop's one page: place an order."""

from __future__ import annotations

from django.urls import path

from shop import views

urlpatterns = [
    path("", views.place_order_view, name="place_order"),
]
