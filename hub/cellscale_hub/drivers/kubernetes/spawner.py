"""User servers on Kubernetes: KubeSpawner with server profiles per desk.

    c.JupyterHub.spawner_class = "cellscale_hub.drivers.kubernetes.spawner.DeskKubeSpawner"
    c.DeskKubeSpawner.desk_profiles = {
        "desk-a": [{"slug": "desk-a-cpu", "display_name": "CPU, 2 cores",
                    "kubespawner_override": {"image": "...", "cpu_guarantee": 2, "mem_guarantee": "4G"}}],
        "desk-b": [...],
    }

A user's desks are their JupyterHub groups that are desks (the same source cellscale's tenancy
reads: `Tenancy.tenants_of(groups)`, auth.py). They see only their desks' profiles; asking for
another desk's slug (the form, or `user_options` through the REST API) is refused with words
naming the desk and the profiles they may use. A profile's server runs in its desk's namespace
(`names.namespace(desk, namespace_prefix)`), as the desk's `cellscale-servers` ServiceAccount
(no API rights, no token mounted), labelled with the desk: the hub needs rights only in the
desks' namespaces (the Role that `drivers.kubernetes.tenancy` renders), never cluster-wide (kubespawner#749),
and which profiles a group may use is configuration (kubespawner#889).
"""

from __future__ import annotations

from kubespawner import KubeSpawner
from traitlets import Dict, List, TraitError, Unicode, default, validate

from cellscale_hub.drivers.kubernetes.names import SERVERS_SERVICE_ACCOUNT, TENANT_LABEL, namespace

DESK_SETS = ("namespace", "service_account", "enable_user_namespaces")  # traits a profile may not override


def check_desk_profiles(desk_profiles: dict[str, list[dict]], namespace_prefix: str = "") -> None:
    """Every desk names a namespace, every profile has a slug unique across desks, and no profile
    overrides what its desk decides (DESK_SETS); a ValueError says which."""
    seen: dict[str, str] = {}
    for desk, profiles in desk_profiles.items():
        namespace(desk, namespace_prefix)  # a desk that cannot name a namespace is refused now
        for profile in profiles:
            slug = profile.get("slug")
            if not slug:
                raise ValueError(
                    f"desk {desk}: every profile needs a slug (display_name {profile.get('display_name')!r})"
                )
            if slug in seen:
                raise ValueError(f"profile slug {slug!r} is used by desks {seen[slug]} and {desk}: slugs are unique")
            seen[slug] = desk
            overridden = sorted(set(profile.get("kubespawner_override", {})) & set(DESK_SETS))
            if overridden:
                raise ValueError(f"profile {slug!r} overrides {', '.join(overridden)}: its desk decides them")


class ProfileRefused(ValueError):
    """The user asked for a profile they may not use; the message says which they may."""


class DeskKubeSpawner(KubeSpawner):
    desk_profiles = Dict(
        key_trait=Unicode(),
        value_trait=List(Dict()),
        config=True,
        help="""Server profiles per desk: {desk (JupyterHub group): [KubeSpawner profile, ...]}.

        Each profile is one of KubeSpawner's `profile_list` entries (display_name, slug,
        description, kubespawner_override, profile_options). Slugs are unique across desks. A
        profile may not override the namespace or the ServiceAccount: its desk decides them.""",
    )
    namespace_prefix = Unicode(
        "",
        config=True,
        help="Prefix of the desks' namespaces (as the tenancy mirror's --prefix): desk-a runs in PREFIXdesk-a.",
    )

    @validate("desk_profiles")
    def _valid_desk_profiles(self, proposal):
        try:
            check_desk_profiles(proposal["value"], self.namespace_prefix)
        except ValueError as exc:
            raise TraitError(str(exc)) from exc
        return proposal["value"]

    @default("profile_list")
    def _profiles_of_the_users_desks(self):
        return self.profiles_for_user

    def desks(self) -> list[str]:
        """The user's desks: their groups that have profiles here, sorted."""
        groups = {group.name for group in self.user.groups}
        return sorted(groups & set(self.desk_profiles))

    def profiles_for_user(self, spawner: KubeSpawner | None = None) -> list[dict]:
        """The user's desks' profiles, each pinned to its desk's namespace and ServiceAccount."""
        profiles = []
        for desk in self.desks():
            for profile in self.desk_profiles[desk]:
                override = {
                    **profile.get("kubespawner_override", {}),
                    "namespace": namespace(desk, self.namespace_prefix),
                    "service_account": SERVERS_SERVICE_ACCOUNT,
                    "automount_service_account_token": False,
                    "extra_labels": {**profile.get("kubespawner_override", {}).get("extra_labels", {}),
                                     TENANT_LABEL: desk},
                }  # fmt: skip
                profiles.append({**profile, "kubespawner_override": override})
        return profiles

    def desk_of_slug(self, slug: str) -> str | None:
        return next((desk for desk, ps in self.desk_profiles.items() if any(p["slug"] == slug for p in ps)), None)

    def check_profile(self, slug: str | None) -> None:
        """Refuse a profile the user may not use, saying why and what they may choose."""
        mine = [profile["slug"] for profile in self.profiles_for_user()]
        who = self.user.name
        if not mine:
            raise ProfileRefused(
                f"{who} is in no desk with server profiles (desks: {', '.join(sorted(self.desk_profiles))}): "
                "an admin adds them to their desk's group"
            )
        if slug is None or slug in mine:
            return
        owner = self.desk_of_slug(slug)
        choose = f"choose one of your desk's profiles: {', '.join(mine)}"
        if owner is None:
            raise ProfileRefused(f"there is no server profile {slug!r}; {choose}")
        raise ProfileRefused(
            f"server profile {slug!r} belongs to desk {owner}, and {who} is not in {owner} "
            f"(their desks: {', '.join(self.desks())}); {choose}"
        )

    async def load_user_options(self):
        self.check_profile((self.user_options or {}).get("profile") or None)
        await super().load_user_options()
