"""The contests app's public page: a reminder's unsubscribe link (config/urls.py includes it)."""

from django.urls import path

from contests import views

app_name = "contests"
urlpatterns = [
    path("reminders/unsubscribe/<str:token>/", views.unsubscribe, name="unsubscribe"),
]
