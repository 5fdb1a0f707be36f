from django.apps import AppConfig


class ContestsConfig(AppConfig):
    name = "contests"
    verbose_name = "Contests"

    def ready(self) -> None:
        from contests import checks  # noqa: F401  (registers the system checks)
