from django.apps import AppConfig


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Job locks"

    def ready(self) -> None:
        from locks import checks  # noqa: F401  (registers the system checks)
