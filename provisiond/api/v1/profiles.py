"""`/api/v1/profiles`: the inventory's profiles (see records.py for what each route does)."""

from provisiond.api.v1.records import NewProfiles, ProfileNames, ProfileQuery, register
from provisiond.service.inventory import PROFILES

register(PROFILES, ProfileQuery, NewProfiles, ProfileNames)
