from django.contrib import admin
from django.urls import path

from contests.ops import views as ops

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/jobs/sync_contests/run", ops.trigger_sync, name="sync-contests-trigger"),
    path("healthz", ops.healthz, name="healthz"),
]
