from django.apps import AppConfig


class AccountsConfig(AppConfig):
    # Listed before django.contrib.auth in INSTALLED_APPS, so its createsuperuser wins.
    name = "config.accounts"
    label = "accounts"
    verbose_name = "Accounts"
