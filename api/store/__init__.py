"""The SQL store: ORM models, CRUD functions, and the planner's profile store on SQL."""

from api.store.profiles import SqlProfileStore, load_bundled_profiles

__all__ = ["SqlProfileStore", "load_bundled_profiles"]
