"""MongoDB support: django-mongodb-backend with two project adjustments.

``config.mongodb`` is the ``ENGINE`` that ``config.database`` picks for a
``mongodb://`` or ``mongodb+srv://`` URL (see ``base.py``), and ``apps.py``
holds the contrib AppConfigs the backend's documentation prescribes.
"""
