{{/*
The alert rules, as a Prometheus rule file's `groups`. The PrometheusRule uses them, and
docker-compose's Prometheus loads the same rules from compose/alerts.yml (a test keeps that
file equal to these rendered with the default values and release name "blackbox").
*/}}
{{- define "blackbox.alertGroups" -}}
{{- $a := .Values.metrics.prometheusRule.alerts }}
{{- $runbooks := .Values.metrics.prometheusRule.runbookUrl }}
{{- $job := include "blackbox.fullname" . }}
groups:
  - name: blackbox
    rules:
      - alert: BlackboxDispatcherStalled
        expr: |
          (blackbox_ready == 0)
            and on (job, instance)
          (min by (job, instance) (blackbox_up) == 1)
            unless on (job, instance)
          (blackbox_redis_full == 1)
            unless on (job, instance)
          (blackbox_intake_stopped_partitions > 0)
        for: {{ $a.stalledFor }}
        labels:
          severity: critical
        annotations:
          summary: "blackbox {{ "{{" }} $labels.instance {{ "}}" }} is not ready although Redis and Kafka answer"
          description: "Its firing clock stopped (no tick for 60 s) or a worker thread died: /live fails and Kubernetes restarts it. Messages due meanwhile fire late."
          runbook_url: "{{ $runbooks }}#blackboxdispatcherstalled"
      - alert: BlackboxDependencyDown
        expr: blackbox_up == 0
        for: {{ $a.dependencyDownFor }}
        labels:
          severity: critical
        annotations:
          summary: "blackbox {{ "{{" }} $labels.instance {{ "}}" }} cannot reach {{ "{{" }} $labels.dependency {{ "}}" }}"
          description: "Intake is paused and firing backs off until {{ "{{" }} $labels.dependency {{ "}}" }} answers again; nothing is lost, due messages fire late."
          runbook_url: "{{ $runbooks }}#blackboxdependencydown"
      - alert: BlackboxRedisLostData
        expr: |
          max by (job, instance) (blackbox_intake_stopped_partitions) > 0
            or max by (job, instance) (blackbox_firing_held_for_lost_data) > 0
        for: {{ $a.redisLostDataFor }}
        labels:
          severity: critical
        annotations:
          summary: "blackbox {{ "{{" }} $labels.instance {{ "}}" }} holds: Redis lost data"
          description: "Redis was flushed, restarted empty or restored from an older snapshot (its clocks say so), or holds less than the intake group committed by more than a failover's lag (BLACKBOX_REREAD_LIMIT): intake stopped reading and firing claims nothing there. The log lines intake_stopped_redis_lost_data and firing_held name what was found. Rebuild Redis from Kafka (blackbox rebuild), or restart with BLACKBOX_REDIS_LOSS=reread (deliver the gap again, what Kafka shows delivered passed over) or skip (give it up)."
          runbook_url: "{{ $runbooks }}#blackboxredislostdata"
      - alert: BlackboxRedisMemoryHigh
        expr: |
          max by (job) (
            blackbox_redis_used_memory_bytes / (blackbox_redis_maxmemory_bytes > 0)
          ) > {{ $a.redisMemoryShare }}
        for: {{ $a.redisMemoryFor }}
        labels:
          severity: warning
        annotations:
          summary: "blackbox's Redis uses {{ "{{" }} $value | humanizePercentage {{ "}}" }} of its maxmemory"
          description: "Past maxmemory Redis refuses new schedules: intake waits (records stay in the intake topic) until firing frees room. Raise maxmemory before then; messages due far ahead free nothing."
          runbook_url: "{{ $runbooks }}#blackboxredismemoryhigh"
      - alert: BlackboxRedisFull
        expr: max by (job) (blackbox_redis_full) == 1
        for: {{ $a.redisFullFor }}
        labels:
          severity: critical
        annotations:
          summary: "blackbox's Redis is over maxmemory: intake waits"
          description: "Redis refuses intake's writes for memory. Firing goes on and drains it as messages fall due, and intake resumes by itself; if the pending messages are due far ahead, only more maxmemory lets intake go on."
          runbook_url: "{{ $runbooks }}#blackboxredisfull"
      - alert: BlackboxLatenessHigh
        expr: |
          histogram_quantile(0.99,
            sum by (job, le) (rate(blackbox_lateness_seconds_bucket[5m]))
          ) > {{ $a.latenessP99Seconds }}
        for: {{ $a.latenessFor }}
        labels:
          severity: warning
        annotations:
          summary: "blackbox delivers late: p99 of acknowledgement - due time is {{ "{{" }} $value | humanizeDuration {{ "}}" }}"
          description: "Compare blackbox_send_lateness_seconds (the service's own part): if it is low too, the broker acknowledges slowly; if high, the replicas cannot keep up."
          runbook_url: "{{ $runbooks }}#blackboxlatenesshigh"
      - alert: BlackboxOverdueBacklogGrowing
        expr: |
          (
            1 - (
              sum by (job) (rate(blackbox_send_lateness_seconds_bucket{le="30.0"}[10m]))
                /
              sum by (job) (rate(blackbox_send_lateness_seconds_count[10m]))
            )
          ) > {{ $a.overdueShare }}
        for: {{ $a.overdueFor }}
        labels:
          severity: warning
        annotations:
          summary: "blackbox fires most messages more than 30 s after their due time"
          description: "{{ "{{" }} $value | humanizePercentage {{ "}}" }} of the messages fired in 10 minutes left more than 30 s late: due messages pile up faster than the replicas fire them."
          runbook_url: "{{ $runbooks }}#blackboxoverduebackloggrowing"
      - alert: BlackboxDeadLettersRising
        expr: sum by (job, reason) (rate(blackbox_dead_letters_total[5m])) * 60 > {{ $a.deadLettersPerMinute }}
        for: {{ $a.deadLettersFor }}
        labels:
          severity: warning
        annotations:
          summary: "blackbox dead-letters {{ "{{" }} $value | humanize {{ "}}" }} records a minute ({{ "{{" }} $labels.reason {{ "}}" }})"
          description: "Records go to the dead-letter topic with reason {{ "{{" }} $labels.reason {{ "}}" }}; its blackbox-dlq-detail header says why."
          runbook_url: "{{ $runbooks }}#blackboxdeadlettersrising"
      - alert: BlackboxStoreRecordMissing
        expr: sum by (job) (increase(blackbox_store_records_missing_total[10m])) > 0
        labels:
          severity: critical
        annotations:
          summary: "blackbox dead-lettered {{ "{{" }} $value | humanize {{ "}}" }} schedules whose store record was missing"
          description: "In index mode Redis named a place in the store topic that did not hold the schedule (the topic emptied, recreated or compacted past it): each went to the dead-letter topic as store_record_missing, undelivered."
          runbook_url: "{{ $runbooks }}#blackboxstorerecordmissing"
      - alert: BlackboxTargetDown
        expr: up{job="{{ $job }}"} == 0
        for: {{ $a.targetDownFor }}
        labels:
          severity: critical
        annotations:
          summary: "Prometheus cannot scrape blackbox {{ "{{" }} $labels.instance {{ "}}" }}"
          description: "The replica is down or its /metrics port unreachable."
          runbook_url: "{{ $runbooks }}#blackboxtargetdown"
{{- end }}
