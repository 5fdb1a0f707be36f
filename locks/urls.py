"""The lock's HTTP endpoints (the trigger, /healthz, /metrics); a project includes them: ``path("", include("locks.urls"))``."""

from django.urls import path

from locks import views

urlpatterns = [
    path("api/jobs/<str:job>/run", views.trigger_job, name="job-trigger"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics_view, name="metrics"),
]
