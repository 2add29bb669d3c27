-- Argo CD health check for openforge.dev/RolloutJob.
-- Install: argocd-cm key resource.customizations.health.openforge.dev_RolloutJob
-- (see docs/cluster.md and deploy/argocd/argocd-cm.yaml).
--
-- Healthy when Complete, Degraded when Failed, Suspended when Suspended,
-- Progressing otherwise, and Progressing while the operator has not yet
-- observed the latest spec (status.observedGeneration < metadata.generation).
local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind and c.status == "True" then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local function counts(status)
  local n = status.counts or {}
  return "succeeded " .. tostring(n.succeeded or 0) .. ", active " .. tostring(n.active or 0)
    .. ", pending " .. tostring(n.pending or 0) .. ", failed " .. tostring(n.failed or 0)
    .. ", retried " .. tostring(n.retried or 0)
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
    .. " (status is for " .. tostring(observed) .. ")"
  return hs
end

local conditions = obj.status.conditions or {}
local failed = condition(conditions, "Failed")
if failed ~= nil then
  hs.status = "Degraded"
  hs.message = describe(failed, "Failed")
  return hs
end
local complete = condition(conditions, "Complete")
if complete ~= nil then
  hs.status = "Healthy"
  hs.message = describe(complete, counts(obj.status))
  return hs
end
local suspended = condition(conditions, "Suspended")
if suspended ~= nil then
  hs.status = "Suspended"
  hs.message = describe(suspended, "Suspended")
  return hs
end

hs.status = "Progressing"
hs.message = counts(obj.status)
return hs
