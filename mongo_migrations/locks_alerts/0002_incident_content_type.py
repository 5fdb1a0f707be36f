# Issue 25: Incident's content type moves with the model (locks.incident -> locks_alerts.incident),
# so the permissions granted on it (view_incident, to users and groups) and its LogEntry rows keep
# pointing at it. A data change only, in both directions; nothing to do on a database where the
# old one does not exist (a fresh install: the content types are created after migrate).

from django.db import migrations


def _move(old: str, new: str):
    def move(apps, schema_editor) -> None:
        ContentType = apps.get_model("contenttypes", "ContentType")
        types = ContentType.objects.using(schema_editor.connection.alias)
        if not types.filter(app_label=new, model="incident").exists():
            types.filter(app_label=old, model="incident").update(app_label=new)

    return move


class Migration(migrations.Migration):

    dependencies = [
        ("locks_alerts", "0001_initial"),
        ("contenttypes", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(_move("locks", "locks_alerts"), _move("locks_alerts", "locks"), elidable=True),
    ]
