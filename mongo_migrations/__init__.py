"""Migrations for MongoDB (settings.MIGRATION_MODULES when DATABASE_URL is a
MongoDB URL): the same models as the apps' own migrations, with ObjectId
primary keys. Regenerate after a model change with
``DATABASE_URL=mongodb://localhost/x python manage.py makemigrations``."""
