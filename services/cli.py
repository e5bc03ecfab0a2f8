"""The `atelier` command: run a service, migrate a schema, issue a development token, check
the APNs settings, write the edge's config for a deployment, or run the whole system
locally."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from services import edge_config
from services.kit.auth import CLOCK_SKEW_SECONDS
from services.kit.settings import CommonSettings, EnvReader, MigrationSettings, SettingsError

SERVICES = ("creation", "media", "notify")
# What `atelier serve` runs: the services, and the operator's console (no schema of its own).
SERVABLE = (*SERVICES, "console")


# A service process that does not say which environment it runs in is a production one:
# it refuses the public development secrets. `atelier dev` and the test stack say `dev`.
SERVE_DEFAULT_ENV = "prod"


def _serve(args: argparse.Namespace) -> int:
    if args.service != "creation" and args.role != "all":
        print(f"atelier serve: --role is for creation, not {args.service}", file=sys.stderr)
        return 2
    # The process becomes the service: its settings are read from this environment.
    defaulted = not os.environ.get("ATELIER_ENV", "").strip()
    if defaulted:
        os.environ["ATELIER_ENV"] = SERVE_DEFAULT_ENV
    module = importlib.import_module(f"services.{args.service}.app")
    try:
        if args.service == "creation":
            return int(module.main(role=args.role))
        return int(module.main())
    except SettingsError as error:
        if defaulted and "prod" in str(error):
            raise SettingsError(
                f"{error}\n(ATELIER_ENV is not set, so this is a production run; "
                "set ATELIER_ENV=dev for a local one)"
            ) from None
        raise


def _migrate(args: argparse.Namespace) -> int:
    from services.kit import migrations
    from services.kit.db_connect import ConnectFailed

    environ = dict(os.environ)
    if args.database_url:
        environ["ATELIER_DATABASE_URL"] = args.database_url
    # Only what migrating uses: the Job that runs this holds no service secret.
    reader = EnvReader(environ)
    settings = MigrationSettings.read(reader)
    reader.finish()
    for name in SERVICES if args.service == "all" else (args.service,):
        try:
            migrations.upgrade(
                name,
                settings.database_url,
                connect_timeout_seconds=settings.connect_timeout_seconds,
            )
        except ConnectFailed as error:
            print(f"atelier migrate: {error}", file=sys.stderr)
            return 1
        print(f"migrated {name}", file=sys.stderr)
    return 0


def _token(args: argparse.Namespace) -> int:
    from services.kit.auth import issue_token, lifetime_problem, principal_id_problem

    reader = EnvReader()
    common = CommonSettings.read(reader)
    reader.finish()
    if args.service:
        print(common.service_token)
        return 0
    if not common.jwt_secret:
        print(
            "atelier token: HS256 is off (ATELIER_JWT_ISSUERS without ATELIER_JWT_SECRET); "
            "users get their tokens from the identity provider",
            file=sys.stderr,
        )
        return 2
    # A token the services would refuse is no use to anyone.
    for option, problem in (
        ("--ttl", lifetime_problem(args.ttl, common.jwt_max_lifetime_seconds)),
        ("--user", principal_id_problem(args.user)),
    ):
        if problem is not None:
            print(f"atelier token: {option} {problem}", file=sys.stderr)
            return 2
    print(
        issue_token(common.jwt_secret, common.jwt_issuer, common.jwt_audience, args.user, args.ttl)
    )
    return 0


def _push_doctor(args: argparse.Namespace) -> int:
    from services.dev import running
    from services.notify.apns import doctor_command
    from services.notify.apns.doctor import ok

    if args.send_to is not None and args.environment is None:
        print("atelier push doctor: --send-to needs --environment", file=sys.stderr)
        return 2
    # Beside a running `atelier dev`, its notify's settings fill in what the environment
    # leaves unset: the doctor checks the stack that runs, its database and APNs peer.
    environ: dict[str, str] = dict(os.environ)
    preface = []
    stack = running.published(running.dev_dir(environ))
    if stack is not None:
        path, settings = stack
        environ = {**settings, **environ}
        preface.append(
            ok("settings", f"from the running `atelier dev` ({path}) where this shell sets none")
        )
    return doctor_command.run(
        args.send_to,
        args.environment or "",
        not args.no_database,
        environ,
        probe=not args.offline,
        preface=preface,
    )


def _edge_config(args: argparse.Namespace) -> int:
    try:
        edge_config.run(args)
    except edge_config.EdgeConfigError as error:
        print(f"atelier edge-config: {error}", file=sys.stderr)
        return 2
    return 0


def _worker(args: argparse.Namespace) -> int:
    from services.creation.remote_worker.worker import main as run_remote_worker

    return run_remote_worker(args.remote)


def _dev(args: argparse.Namespace) -> int:
    from services.dev.launcher import run_dev

    return run_dev()


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="atelier", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run one service (settings from ATELIER_*; ATELIER_ENV defaults to prod here)",
    )
    serve.add_argument("service", choices=SERVABLE)
    serve.add_argument(
        "--role",
        choices=("api", "worker", "all"),
        default="all",
        help="creation only: api (RPCs), worker (background components) or all",
    )
    serve.set_defaults(run=_serve)

    migrate = commands.add_parser("migrate", help="apply a service's schema migrations")
    migrate.add_argument("service", choices=(*SERVICES, "all"))
    migrate.add_argument("--database-url", help="defaults to ATELIER_DATABASE_URL")
    migrate.set_defaults(run=_migrate)

    token = commands.add_parser(
        "token",
        help="print a user JWT signed with ATELIER_JWT_SECRET",
        description=(
            "Print a user JWT signed with ATELIER_JWT_SECRET. The services allow for"
            f" {CLOCK_SKEW_SECONDS} s of clock difference between the issuer and"
            f" themselves: a token is accepted until {CLOCK_SKEW_SECONDS} s after its exp"
            f" (so --ttl 1 works for about {CLOCK_SKEW_SECONDS + 1} s), and refused as"
            " TOKEN_EXPIRED after that."
        ),
    )
    token.add_argument("--user", default="dev-user", help="the token's subject (user id)")
    token.add_argument(
        "--ttl",
        type=int,
        default=24 * 3600,
        help=f"lifetime in seconds (exp - iat); accepted {CLOCK_SKEW_SECONDS} s past exp",
    )
    token.add_argument(
        "--service",
        action="store_true",
        help="print the service credential instead (ATELIER_SERVICE_TOKEN, or the dev one)",
    )
    token.set_defaults(run=_token)

    push = commands.add_parser("push", help="APNs tools")
    push_commands = push.add_subparsers(dest="push_command", required=True)
    doctor = push_commands.add_parser(
        "doctor",
        help="check the APNs settings (ATELIER_APNS_*) and that APNs accepts them (a push to a "
        "dummy device token on each host); exits 1 on a problem",
    )
    doctor.add_argument(
        "--send-to", metavar="TOKEN", help="send a test push to this device token instead"
    )
    doctor.add_argument("--environment", choices=("sandbox", "production"))
    doctor.add_argument(
        "--no-database", action="store_true", help="skip the registered tokens' checks"
    )
    doctor.add_argument(
        "--offline", action="store_true", help="check the settings only: no push to APNs"
    )
    doctor.set_defaults(run=_push_doctor)

    edge = commands.add_parser(
        "edge-config",
        help="write the edge's Envoy config for a deployment (its upstreams and descriptor)",
    )
    edge_config.add_arguments(edge)
    edge.set_defaults(run=_edge_config)

    worker = commands.add_parser(
        "worker",
        help="run a remote worker: jobs from creation's WorkerService, no database "
        "(ATELIER_REMOTE_WORKER_*; see docs/remote-workers.md)",
    )
    worker.add_argument(
        "--remote",
        default="",
        metavar="ADDRESS",
        help="creation's WorkerService: its TLS listener (host:port), or the internal "
        "listener with ATELIER_REMOTE_WORKER_PLAINTEXT; default ATELIER_REMOTE_WORKER_ADDRESS",
    )
    worker.set_defaults(run=_worker)

    dev = commands.add_parser("dev", help="run everything locally on embedded defaults")
    dev.set_defaults(run=_dev)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except SettingsError as error:
        print(f"atelier {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
