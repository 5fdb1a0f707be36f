from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "contests.ops"
    label = "ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        from contests.ops import checks  # noqa: F401  (registers the system checks)
