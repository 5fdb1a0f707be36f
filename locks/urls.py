"""The lock's HTTP endpoints (the trigger, /healthz, /metrics); a project includes them: ``path("", include("locks.urls"))``."""

from django.urls import path

from locks import views
from locks.views import metrics_view

urlpatterns = [
    path("api/jobs/<str:job>/run", views.trigger_job, name="job-trigger"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
]
