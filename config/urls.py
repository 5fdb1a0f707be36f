from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("locks.urls")),  # POST /api/jobs/<job>/run, GET /healthz
    path("", include("contests.urls")),  # a reminder's unsubscribe link
]
