"""The OpenForge operator: reconciles RolloutJob and HarnessEnv objects into rollout pods.

Runs under kopf (`openforge operator`). Pure builders (pods, secrets, network
policies, status) live apart from the one module that talks to the API server.
"""
