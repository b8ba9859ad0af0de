"""Place an order from a form: the order and its notification commit together."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from shop import services
from shop.models import Order

#: What an order placed from the form holds (the form asks for no items).
FORM_ITEMS = ("mug", "t-shirt")


def place_order_view(request: HttpRequest) -> HttpResponse:
    """GET: the form and the latest orders. POST: place an order, then show it."""
    placed: Order | None = None
    error = ""
    if request.method == "POST":
        try:
            total = Decimal(request.POST.get("total", "0"))
        except InvalidOperation:
            total = Decimal("-1")
        customer = request.POST.get("customer", "").strip()
        if customer and total > 0:
            placed = services.place_order(
                customer=customer,
                total=total,
                phone=request.POST.get("phone", "").strip(),
                device=request.POST.get("device", "").strip(),
                items=FORM_ITEMS,
            )
        else:
            error = "Give a customer name and a positive total."
    orders = Order.objects.prefetch_related("notifications").order_by("-id")[:20]
    return render(
        request,
        "shop/place_order.html",
        {"placed": placed, "error": error, "orders": orders},
        status=400 if error else 200,
    )
