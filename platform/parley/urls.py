from django.contrib import admin
from django.urls import include, path

from . import security, views

urlpatterns = [
    # Before admin.site.urls, so the login page the admin links to is the limited one.
    path("admin/login/", security.limited_admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("", include("studies.participation.urls")),
]
