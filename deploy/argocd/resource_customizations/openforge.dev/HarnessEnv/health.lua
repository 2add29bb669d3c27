-- Argo CD health check for openforge.dev/HarnessEnv.
-- Install: argocd-cm key resource.customizations.health.openforge.dev_HarnessEnv
-- (see docs/cluster.md and deploy/argocd/argocd-cm.yaml).
--
-- Healthy when Ready is True, Degraded when Ready is False, Progressing while
-- Ready is Unknown or unset, or while the operator has not yet observed the
-- latest spec (status.observedGeneration < metadata.generation).
local hs = {}

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

for _, c in ipairs(obj.status.conditions or {}) do
  if c.type == "Ready" then
    local message = c.message
    if message == nil or message == "" then
      message = c.reason or ""
    end
    if c.status == "True" then
      hs.status = "Healthy"
    elseif c.status == "False" then
      hs.status = "Degraded"
    else
      hs.status = "Progressing"
    end
    hs.message = message
    return hs
  end
end

hs.status = "Progressing"
hs.message = "Waiting for the Ready condition"
return hs
