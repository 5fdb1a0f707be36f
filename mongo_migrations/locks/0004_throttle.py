# The HTTP trigger's rate limit, which lived in the `ops` app (table ops_throttle) until the
# trigger moved into locks: a new table. The old one held windows of a few seconds, so
# nothing in it is worth keeping (docs/deployment.md, Upgrading).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('locks', '0003_committed_token'),
    ]

    operations = [
        migrations.CreateModel(
            name='Throttle',
            fields=[
                ('key', models.CharField(help_text='What is limited, e.g. send_digest:203.0.113.7.', max_length=200, primary_key=True, serialize=False)),
                ('until', models.DateTimeField(help_text='The next request for this key is refused before this (database clock).')),
            ],
            options={
                'verbose_name': 'rate limit',
            },
        ),
    ]
