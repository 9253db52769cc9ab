// Logs and telemetry: Application Insights on a Log Analytics workspace. Local (key) ingestion
// is off; the function app sends with its managed identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING).

param workspaceName string

param appInsightsName string

param location string

param tags object = {}

@description('Days of log retention in the workspace.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

// ---------- Alerts and the maintenance workbook ----------
@description('Service Bus namespace whose dead-letter counts are watched.')
param serviceBusNamespaceName string

@description('Queues and topics watched for dead-lettered messages (a topic\'s count covers all its subscriptions).')
param deadLetterEntities array

@description('Where alerts are e-mailed. Empty, with no alertActionGroupId either: the alerts notify nobody (the deployment\'s alertReceivers output says so).')
param alertEmail string = ''

@description('Resource id of an existing action group (your on-call routing) that every alert notifies too. Empty: only the bridge\'s own action group (alertEmail).')
param alertActionGroupId string = ''

// Every alert notifies these: the bridge's own group, then the operator's existing one.
var alertActionGroups = concat([alerts.id], empty(alertActionGroupId) ? [] : [alertActionGroupId])

// A log alert's windowSize takes only some durations (1, 5, 10, 15, 30, 45 minutes, 1 to 6
// hours, 1 or 2 days), and not less than its evaluationFrequency (PT5M here):
// https://learn.microsoft.com/azure/azure-monitor/alerts/alerts-create-log-alert-rule
@description('The watchdog runs every minute: alert when it has not run for this long.')
@allowed([
  5
  10
  15
  30
  45
  60
  120
  180
  240
  300
  360
])
param watchdogSilentMinutes int = 10
var watchdogWindow = watchdogSilentMinutes < 60 ? 'PT${watchdogSilentMinutes}M' : 'PT${watchdogSilentMinutes / 60}H'

@description('Alert when admission rejects more than this share (percent) of the relay messages it judged in 15 minutes, with at least admissionRejectMinimum rejected.')
@minValue(1)
@maxValue(100)
param admissionRejectPercent int = 20

@description('The admission-rejections alert needs at least this many rejected messages in its 15 minutes, besides the share: a small fleet sends a few documents per event, so a minimum of messages judged (it was 50) was never reached there.')
@minValue(1)
param admissionRejectMinimum int = 3

// The alert's query ignores a window with fewer than admissionRejectMinimum rejections:
// there the share says little. Multi-line strings take no interpolation, so the query
// names the minimum MINIMUM_REJECTED and replace() puts the parameter in.

// Built-in role: Monitoring Metrics Publisher (needed for Entra-authenticated ingestion).
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
    IngestionMode: 'LogAnalytics'
  }
}

resource functionPublishesTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, functionPrincipalId, monitoringMetricsPublisher)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output appInsightsName string = appInsights.name
output connectionString string = appInsights.properties.ConnectionString
output workspaceId string = workspace.id

// Every alert goes to one action group; e-mail only when an address is given.
resource alerts 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: 'ag-${workspaceName}'
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: 'sebridge'
    enabled: true
    emailReceivers: empty(alertEmail) ? [] : [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: serviceBusNamespaceName
}

// Dead-lettered messages, per entity (Service Bus metrics name queues and topics; a topic's
// count is the sum over its subscriptions: teams, pagerduty, webhook, slack, terminate).
resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = [
  for entity in deadLetterEntities: {
    name: 'dead-letters-${entity}-${workspaceName}'
    location: 'global'
    tags: tags
    properties: {
      description: 'Messages were dead-lettered on ${entity}: inspect them in Service Bus Explorer (README: Monitoring).'
      severity: 2
      enabled: true
      scopes: [
        serviceBus.id
      ]
      evaluationFrequency: 'PT5M'
      windowSize: 'PT15M'
      criteria: {
        'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
        allOf: [
          {
            criterionType: 'StaticThresholdCriterion'
            name: 'deadlettered'
            metricNamespace: 'Microsoft.ServiceBus/namespaces'
            metricName: 'DeadletteredMessages'
            dimensions: [
              {
                name: 'EntityName'
                operator: 'Include'
                values: [
                  entity
                ]
              }
            ]
            operator: 'GreaterThan'
            threshold: 0
            timeAggregation: 'Maximum'
          }
        ]
      }
      actions: [for group in alertActionGroups: {
        actionGroupId: group
      }]
    }
  }
]

// Log alerts over Application Insights. The app writes one `sebridge {json}` line per
// published transition and per watchdog run (functions/telemetry.py); the queries parse it.
var logAlerts = [
  {
    name: 'function-failures'
    description: 'A function invocation failed (ingest, watchdog, a channel, the drain workflow or a page).'
    severity: 2
    query: '''
requests
| where success == false
| summarize failures = count() by operation_Name
'''
    // One alert per operation_Name: says which one is in trouble.
    dimensions: [
      'operation_Name'
    ]
    measure: 'failures'
    operator: 'GreaterThan'
    threshold: 0
    window: 'PT15M'
  }
  {
    name: 'watchdog-not-running'
    description: 'The watchdog has not run for ${watchdogSilentMinutes} minutes: silent relays, overdue events and deferred approvals go unnoticed.'
    severity: 1
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "watchdog_run"
| summarize runs = count()
'''
    dimensions: []
    measure: 'runs'
    operator: 'LessThan'
    threshold: 1
    window: watchdogWindow
  }
  {
    name: 'relay-silent'
    description: 'A relay stopped reporting: its VM\'s events are not seen and it cannot approve.'
    severity: 2
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) == "relay_silent"
| summarize silent = count() by vm = tostring(d.vm)
'''
    // One alert per vm: says which one is in trouble.
    dimensions: [
      'vm'
    ]
    measure: 'silent'
    operator: 'GreaterThan'
    threshold: 0
    window: 'PT15M'
  }
  {
    name: 'approval-failed'
    description: 'No relay could approve an event: it starts at NotBefore, without the policy\'s say.'
    severity: 1
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) == "approval_failed"
| summarize failed = count() by event_id = tostring(d.event_id)
'''
    // One alert per event_id: says which one is in trouble.
    dimensions: [
      'event_id'
    ]
    measure: 'failed'
    operator: 'GreaterThan'
    threshold: 0
    window: 'PT15M'
  }
  {
    name: 'admission-rejections'
    description: 'Admission rejected more than ${admissionRejectPercent}% of relay messages in 15 minutes, at least ${admissionRejectMinimum} of them: the sign of a mismatch with Azure (attested documents, their chain, Resource Graph), not of one bad VM in a large fleet. Read the reasons in the rejected table; ATTESTATION_MODE=report admits while it is fixed.'
    severity: 1
    query: replace('''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "admission"
| summarize rejected = sum(toint(d.rejected)), judged = sum(toint(d.admitted)) + sum(toint(d.rejected))
| where rejected >= MINIMUM_REJECTED
| extend rejected_percent = 100.0 * rejected / judged
''', 'MINIMUM_REJECTED', string(admissionRejectMinimum))
    dimensions: []
    measure: 'rejected_percent'
    operator: 'GreaterThan'
    threshold: admissionRejectPercent
    window: 'PT15M'
  }
  {
    name: 'policy-invalid'
    description: 'The approval policy or a setting is invalid: nothing is approved until it is fixed (python -m functions settings check names it).'
    severity: 1
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) == "policy_invalid"
| summarize invalid = count()
'''
    dimensions: []
    measure: 'invalid'
    operator: 'GreaterThan'
    threshold: 0
    window: 'PT15M'
  }
]

resource logAlertRules 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = [
  for rule in logAlerts: {
    name: '${rule.name}-${workspaceName}'
    location: location
    tags: tags
    properties: {
      displayName: 'Scheduled Events bridge: ${rule.name}'
      description: rule.description
      severity: rule.severity
      enabled: true
      scopes: [
        appInsights.id
      ]
      evaluationFrequency: 'PT5M'
      windowSize: rule.window
      criteria: {
        allOf: [
          {
            query: rule.query
            // Sum the query's own count column: a `summarize count()` always returns a row.
            timeAggregation: 'Total'
            metricMeasureColumn: rule.measure
            dimensions: [
              for dimension in rule.dimensions: {
                name: dimension
                operator: 'Include'
                values: [
                  '*'
                ]
              }
            ]
            operator: rule.operator
            threshold: rule.threshold
            failingPeriods: {
              numberOfEvaluationPeriods: 1
              minFailingPeriodsToAlert: 1
            }
          }
        ]
      }
      autoMitigate: true
      actions: {
        actionGroups: alertActionGroups
      }
    }
  }
]

// The workbook: maintenance over time, decisions by rule, approvals and their lead time.
var workbookQueries = [
  {
    title: 'Transitions over time'
    visualization: 'timechart'
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition"
| summarize announcements = dcount(tostring(d.message_id)) by transition = tostring(d.transition), bin(timestamp, 1h)
'''
  }
  {
    title: 'Decisions by rule and action'
    visualization: 'barchart'
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) == "decided"
| summarize events = dcount(tostring(d.event_id)) by rule = tostring(d.rule), action = tostring(d.action), event_type = tostring(d.event_type)
'''
  }
  {
    title: 'Approval lead time before NotBefore (minutes)'
    visualization: 'table'
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) == "approved"
| extend lead_minutes = datetime_diff("second", todatetime(d.not_before), todatetime(d.occurred_at)) / 60.0
| project timestamp, event_id = tostring(d.event_id), event_type = tostring(d.event_type), vms = tostring(d.vms), detail = tostring(d.detail), lead_minutes
| order by timestamp desc
'''
  }
  {
    title: 'Manual approvals'
    visualization: 'table'
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "manual_approval"
| project timestamp, event_id = tostring(d.event_id), by = tostring(d.by), outcome = tostring(d.outcome), detail = tostring(d.detail)
| order by timestamp desc
'''
  }
  {
    title: 'Failures and silent relays'
    visualization: 'table'
    query: '''
traces
| where message startswith "sebridge "
| extend d = parse_json(substring(message, 9))
| where tostring(d.kind) == "transition" and tostring(d.transition) in ("approval_failed", "drain_failed", "overdue", "relay_silent", "policy_invalid")
| project timestamp, transition = tostring(d.transition), event_id = tostring(d.event_id), vm = tostring(d.vm), detail = tostring(d.detail)
| order by timestamp desc
'''
  }
]

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, appInsights.id, 'maintenance-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'Scheduled Events bridge: maintenance'
    category: 'workbook'
    sourceId: appInsights.id
    serializedData: string({
      version: 'Notebook/1.0'
      items: [
        for (item, index) in workbookQueries: {
          type: 3
          name: 'query-${index}'
          content: {
            version: 'KqlItem/1.0'
            title: item.title
            query: item.query
            size: 0
            timeContext: {
              durationMs: 604800000
            }
            queryType: 0
            resourceType: 'microsoft.insights/components'
            visualization: item.visualization
          }
        }
      ]
      isLocked: false
      fallbackResourceIds: [
        appInsights.id
      ]
    })
  }
}

output actionGroupId string = alerts.id
// Who hears an alert; "NONE" said loudly when nobody does (main.bicep outputs it).
output alertReceivers string = empty(alertEmail) && empty(alertActionGroupId) ? 'NONE: the bridge-down alerts (watchdog-not-running, function-failures, dead letters, ...) notify nobody; set alertEmail or alertActionGroupId and deploy again' : (empty(alertActionGroupId) ? 'e-mail ${alertEmail}' : (empty(alertEmail) ? 'action group ${alertActionGroupId}' : 'e-mail ${alertEmail}; action group ${alertActionGroupId}'))
output workbookId string = workbook.id
