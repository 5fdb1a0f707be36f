"""AppConfigs for Django's contrib apps and django-axes on MongoDB (settings picks them only
when MongoDB is selected). Their stock configs pin ``AutoField``, which
MongoDB cannot store; every model there gets an ObjectId primary key."""

from axes.apps import AppConfig as AxesConfig
from django.contrib.admin.apps import AdminConfig
from django.contrib.auth.apps import AuthConfig
from django.contrib.contenttypes.apps import ContentTypesConfig

from config.database import MONGODB_AUTO_FIELD


class MongoAdminConfig(AdminConfig):
    default_auto_field = MONGODB_AUTO_FIELD


class MongoAuthConfig(AuthConfig):
    default_auto_field = MONGODB_AUTO_FIELD


class MongoContentTypesConfig(ContentTypesConfig):
    default_auto_field = MONGODB_AUTO_FIELD


class MongoAxesConfig(AxesConfig):
    default_auto_field = MONGODB_AUTO_FIELD
