from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="SlotWrite",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("job", models.CharField(max_length=100)),
                ("tick", models.DateTimeField(blank=True, help_text="Empty for forced runs.", null=True)),
                ("token", models.PositiveBigIntegerField()),
                ("holder", models.CharField(max_length=255)),
                ("written_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "indexes": [models.Index(fields=["job", "tick"], name="slotwrite_job_tick")],
            },
        ),
    ]
