"""The site's addresses and one more whose view fails, for the 500 page's tests."""

from django.urls import path

from batchdesk.urls import handler500
from batchdesk.urls import urlpatterns as site_urlpatterns


def fault(request):
    raise RuntimeError("a fault of ours")


urlpatterns = [path("fault/", fault), *site_urlpatterns]

__all__ = ["handler500", "urlpatterns"]
