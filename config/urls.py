from django.contrib import admin
from django.urls import path

from contests.ops import views as ops

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/jobs/<str:job>/run", ops.trigger_job, name="job-trigger"),
    path("healthz", ops.healthz, name="healthz"),
]
