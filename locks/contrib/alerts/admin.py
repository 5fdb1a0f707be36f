from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from locks.admin import ReadOnlyAdminMixin, Styled, timestamp
from locks.contrib.alerts.models import Incident


@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    list_display = ("job_name", "reason", "summary", "opened", "closed", "opened_mail", "closed_mail")
    list_filter = ("job_name", "reason", ("closed_at", admin.EmptyFieldListFilter))
    search_fields = ("job_name", "summary", "last_error")
    fields = (*list_display, "last_error")
    readonly_fields = fields
    opened = timestamp("opened_at", _("opened"))
    closed = timestamp("closed_at", _("closed"))
    opened_mail = timestamp("opened_mail_at", _("opening email settled"))
    closed_mail = timestamp("closed_mail_at", _("recovery email settled"))
