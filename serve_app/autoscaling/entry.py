"""The import path of the coupled policy in the serve config: `serve_app.autoscaling.entry:CoupledPolicy`.

Ray Serve cloudpickles the module a policy path names *by value* (`cloudpickle.register_pickle_by_value`) and
the controller runs the copy. This module only re-exports the class, which lives in another module and is
therefore pickled by reference: the controller imports `serve_app.autoscaling.ray_policy` from the image like
any other module (one copy of its code, its loggers and metrics), nothing of the project travels pickled.
tests/autoscaling checks that the pickle Ray makes is a reference.
"""

from serve_app.autoscaling.ray_policy import CoupledPolicy

__all__ = ["CoupledPolicy"]
