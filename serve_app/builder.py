"""serveConfigV2 entry point: `import_path: serve_app.builder:build_app`, `args:` = AppConfig.

Builds the same graph as Ray Serve LLM's builders, with our server classes:
  disaggregated: ingress -> Decode:<model> (SelectiveDecodeServer) -> Prefill:<model> (MeteredPrefillServer)
  aggregated:    ingress -> Aggregated:<model> (MeteredServer)
With frontend.direct_streaming the serving deployment is itself the HTTP ingress (serve_app/engine/direct.py),
as Ray's builders make it under RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING:
  disaggregated: Decode:<model> (DirectSelectiveDecodeServer) -> Prefill:<model>
  aggregated:    Aggregated:<model> (DirectMeteredServer)
Ray's `build_pd_openai_app` hard-codes PDDecodeServer, so the P/D graph is composed here from Ray's
own pieces (PDServingArgs validation, build_llm_deployment, the OpenAI ingress factory).
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import ValidationError
from ray import serve
from ray.serve.deployment import Application
from ray.serve.llm import LLMConfig

from serve_app.upstream import (
    PDServingArgs,
    build_llm_deployment,
    make_fastapi_ingress,
    maybe_apply_llm_deployment_config_defaults,
    to_model_metadata,
)
from serve_app.config import ENGINE_DEPLOYMENT_PREFIX, FRONTEND_DEPLOYMENT, AppConfig
from serve_app.frontend.app import ENDPOINTS, make_app
from serve_app.frontend.ingress import BoundedOpenAiIngress
from serve_app.llm_configs import frontend_deployment_config, role_llm_config
from serve_app.engine.servers import (
    DirectMeteredServer,
    DirectSelectiveDecodeServer,
    MeteredPrefillServer,
    MeteredServer,
    SelectiveDecodeServer,
)


class AppConfigError(ValueError):
    """The serve config's `args` do not describe a valid app."""


def parse_app_config(args: Mapping[str, Any] | AppConfig) -> AppConfig:
    if isinstance(args, AppConfig):
        return args
    try:
        return AppConfig.model_validate(dict(args))
    except ValidationError as exc:
        raise AppConfigError(
            f"serve_app.builder:build_app: invalid args (serveConfigV2 applications[].args / chart "
            f"values):\n{exc}"
        ) from exc


def llm_configs(app: AppConfig) -> dict[str, LLMConfig]:
    """One validated Ray LLMConfig per engine role of the app."""
    return {role: LLMConfig.model_validate(role_llm_config(app, role)) for role in app.roles()}


def build_app(args: Mapping[str, Any] | AppConfig) -> Application:
    app = parse_app_config(args)
    configs = llm_configs(app)  # (AppConfig refuses engine_args.data_parallel_size > 1)

    direct = app.frontend.direct_streaming
    if app.mode == "disaggregated":
        pd = PDServingArgs.model_validate(
            {"prefill_config": configs["prefill"], "decode_config": configs["decode"]}
        )
        prefill = build_llm_deployment(
            pd.prefill_config, name_prefix=ENGINE_DEPLOYMENT_PREFIX["prefill"], deployment_cls=MeteredPrefillServer
        )
        served_config = pd.decode_config
        bind_kwargs: dict[str, Any] = {
            "prefill_server": prefill,
            "remote_prefill_min_tokens": app.remote_prefill_min_tokens,
            "failover": app.failover,
        }
        prefill_name = prefill._bound_deployment.name
        if direct:
            bind_kwargs.update(app_config=app, role_deployments={"prefill": prefill_name})
            return _direct(served_config, ENGINE_DEPLOYMENT_PREFIX["decode"], DirectSelectiveDecodeServer, bind_kwargs)
        served = build_llm_deployment(
            served_config, name_prefix=ENGINE_DEPLOYMENT_PREFIX["decode"], deployment_cls=SelectiveDecodeServer, bind_kwargs=bind_kwargs
        )
        roles = {"decode": served._bound_deployment.name, "prefill": prefill_name}
    else:
        served_config = configs["decode"]
        if direct:
            return _direct(served_config, ENGINE_DEPLOYMENT_PREFIX["aggregated"], DirectMeteredServer, {"app_config": app})
        served = build_llm_deployment(served_config, name_prefix=ENGINE_DEPLOYMENT_PREFIX["aggregated"], deployment_cls=MeteredServer)
        roles = {"decode": served._bound_deployment.name}
    return _bind_ingress(app, served_config, served, roles)


def _direct(served_config: LLMConfig, name_prefix: str, cls: type, bind_kwargs: dict[str, Any]) -> Application:
    """The serving deployment as the HTTP ingress (its ASGI app built late, once the engine runs).

    Unlike Ray's direct-streaming builders, no LLMRouter deployment: HAProxy would ask it over HTTP which
    replica takes each request (~3 ms more per request on 2 CPU cores); without one, HAProxy balances the serving replicas
    itself (leastconn, RAY_SERVE_HAPROXY_BALANCE_ALGORITHM), as it does any ingress deployment. The cost:
    no body-aware routing (prefix-cache affinity), which this app does not configure.
    """
    return build_llm_deployment(
        served_config, name_prefix=name_prefix, deployment_cls=serve.ingress()(cls), bind_kwargs=bind_kwargs
    )


def _bind_ingress(app: AppConfig, served_config: LLMConfig, served: Application, roles: dict[str, str]) -> Application:
    options = maybe_apply_llm_deployment_config_defaults(
        BoundedOpenAiIngress.get_deployment_options([served_config]), frontend_deployment_config(app)
    )
    options["name"] = FRONTEND_DEPLOYMENT  # the chart names it in serveConfigV2 `deployments` (AppConfig.deployment_names)
    model_id = served_config.model_id
    return serve.deployment(
        make_fastapi_ingress(BoundedOpenAiIngress, endpoint_map=ENDPOINTS, app=make_app(app)), **options
    ).bind(
        llm_deployments={model_id: served},
        model_cards={model_id: to_model_metadata(model_id, served_config)},
        lora_paths={},
        app_config=app,
        role_deployments=roles,
    )
