// disagg dashboard: fetches api/state every `?refresh=` seconds (default 2, 0 = never) and
// renders one card per DisaggDeployment. No libraries, no external resources: charts are SVG.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  let refresh = parseFloat(params.get("refresh"));
  if (!(refresh >= 0)) refresh = 2;
  const SVGNS = "http://www.w3.org/2000/svg";
  const POOL_COLORS = { encoder: "#8e44ad", prefill: "#1f77b4", decode: "#e8710a", colocated: "#2ca02c" };
  const EXTRA_COLORS = ["#d62728", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f"];
  const state = { updates: 0, last: null, loadId: Math.random().toString(36).slice(2) };
  window.disaggDashboard = state;

  // -- tiny DOM helpers ------------------------------------------------------
  function append(el, children) {
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      if (Array.isArray(c)) append(el, c);
      else el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.setAttribute("class", v);
      else if (k === "style") el.style.cssText = v; // CSSOM: allowed by the page's CSP, unlike style=""
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    return el;
  }
  function h(tag, attrs, ...children) {
    return append(setAttrs(document.createElement(tag), attrs), children);
  }
  function s(tag, attrs, ...children) {
    return append(setAttrs(document.createElementNS(SVGNS, tag), attrs), children);
  }

  // -- formatting --------------------------------------------------------------
  function isNum(x) {
    return typeof x === "number" && isFinite(x);
  }
  function fmtNum(x, digits) {
    if (!isNum(x)) return "–";
    const d = digits === undefined ? (Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 2) : digits;
    return x.toFixed(d).replace(/\.0+$|(\.\d*?)0+$/, "$1");
  }
  function fmtSec(x) {
    if (!isNum(x)) return "–";
    if (Math.abs(x) < 1) return fmtNum(x * 1000, x * 1000 >= 100 ? 0 : 1) + " ms";
    return fmtNum(x) + " s";
  }
  function fmtTime(t, axis) {
    if (typeof t === "string") {
      const d = new Date(t);
      return isNaN(d) ? t : d.toLocaleTimeString([], { hour12: false });
    }
    if (!isNum(t)) return "";
    if (axis === "relative") return fmtNum(t, t >= 100 ? 0 : 1) + " s";
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }
  function poolColor(pool, i) {
    return POOL_COLORS[pool] || EXTRA_COLORS[i % EXTRA_COLORS.length];
  }
  function poolOrder(names) {
    const order = ["encoder", "prefill", "decode", "colocated"];
    return names.slice().sort((a, b) => {
      const ia = order.indexOf(a) < 0 ? 9 : order.indexOf(a);
      const ib = order.indexOf(b) < 0 ? 9 : order.indexOf(b);
      return ia - ib || (a < b ? -1 : a > b ? 1 : 0);
    });
  }

  // -- SVG line chart ------------------------------------------------------------
  // series: [{label, color, dashed, step, points: [[t, y], ...]}]; hlines: [{y, label, color}]
  function niceStep(range, ticks, integer) {
    const raw = range / Math.max(1, ticks);
    const mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((v) => v >= raw) || 10 * mag;
    if (integer) step = Math.max(1, Math.round(step));
    return step;
  }
  function lineChart(opts) {
    const W = opts.width || 640;
    const H = opts.height || 200;
    const m = { l: 42, r: 12, t: 10, b: 22 };
    const series = (opts.series || []).filter((se) => se.points.some((p) => isNum(p[1])));
    const hlines = (opts.hlines || []).filter((l) => isNum(l.y));
    const svg = s("svg", {
      class: "chart",
      viewBox: `0 0 ${W} ${H}`,
      role: "img",
      "aria-label": opts.title || "chart",
      "data-chart": opts.id || null,
    });
    const all = series.flatMap((se) => se.points.filter((p) => isNum(p[0]) && isNum(p[1])));
    if (!all.length) {
      svg.appendChild(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
      return svg;
    }
    let t0 = Math.min(...all.map((p) => p[0]));
    let t1 = Math.max(...all.map((p) => p[0]));
    if (t1 - t0 < 1e-9) {
      t0 -= 1;
      t1 += 1;
    }
    let yMax = Math.max(...all.map((p) => p[1]), ...hlines.map((l) => l.y));
    const yMin = Math.min(0, ...all.map((p) => p[1]));
    if (yMax <= yMin) yMax = yMin + 1;
    const step = niceStep(yMax - yMin, 4, opts.integer);
    yMax = Math.ceil((yMax * 1.05) / step) * step;
    const x = (t) => m.l + ((t - t0) / (t1 - t0)) * (W - m.l - m.r);
    const y = (v) => H - m.b - ((v - yMin) / (yMax - yMin)) * (H - m.t - m.b);

    for (let v = yMin; v <= yMax + 1e-9; v += step) {
      svg.appendChild(s("line", { class: "grid-line", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      const label = opts.format ? opts.format(v) : fmtNum(v);
      svg.appendChild(s("text", { x: m.l - 5, y: y(v) + 3, "text-anchor": "end" }, label));
    }
    svg.appendChild(s("line", { class: "axis", x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
    const nx = W <= 400 ? 2 : 4;
    let prevLabel = null;
    for (let i = 0; i <= nx; i++) {
      const t = t0 + ((t1 - t0) * i) / nx;
      const label = fmtTime(t, opts.timeAxis);
      if (label === prevLabel) continue;
      prevLabel = label;
      const anchor = i === 0 ? "start" : i === nx ? "end" : "middle";
      svg.appendChild(s("text", { x: x(t), y: H - 6, "text-anchor": anchor }, label));
    }
    for (const l of hlines) {
      svg.appendChild(
        s("line", {
          x1: m.l, x2: W - m.r, y1: y(l.y), y2: y(l.y),
          stroke: l.color || "#c62828", "stroke-width": 1.5, "stroke-dasharray": "2 3",
        }),
      );
      svg.appendChild(
        s("text", { x: W - m.r - 2, y: y(l.y) - 3, "text-anchor": "end", style: `fill:${l.color || "#c62828"}` }, l.label || ""),
      );
    }
    for (const se of series) {
      let d = "";
      let prev = null;
      for (const [t, v] of se.points) {
        if (!isNum(t) || !isNum(v)) {
          prev = null;
          continue;
        }
        if (prev === null) d += `M${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        else if (se.step) d += `H${x(t).toFixed(1)}V${y(v).toFixed(1)}`;
        else d += `L${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        prev = v;
      }
      const pts = se.points.filter((p) => isNum(p[0]) && isNum(p[1]));
      if (pts.length === 1) {
        svg.appendChild(s("circle", { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 3, fill: se.color }));
      }
      svg.appendChild(
        s("path", {
          d, fill: "none", stroke: se.color, "stroke-width": se.dashed ? 1.6 : 2.2,
          "stroke-dasharray": se.dashed ? "6 4" : null, "stroke-linejoin": "round",
          "data-series": se.label,
        }),
      );
    }
    return svg;
  }
  function legend(items) {
    return h(
      "div",
      { class: "legend" },
      items.map((it) => {
        const mark = s("svg", { width: 22, height: 8 },
          s("line", { x1: 1, x2: 21, y1: 4, y2: 4, stroke: it.color, "stroke-width": 2.2, "stroke-dasharray": it.dashed ? "5 3" : null }));
        return h("span", { class: "key" }, mark, it.label);
      }),
    );
  }

  // -- card sections -------------------------------------------------------------
  function conditionClass(c) {
    const on = c.status === "True";
    if (c.status !== "True" && c.status !== "False") return "";
    if (c.type === "Ready" || c.type === "MetricsAvailable") return on ? "good" : "bad";
    if (c.type === "Degraded" || c.type === "InvalidSpec") return on ? "bad" : "";
    if (c.type === "BudgetLimited") return on ? "warn" : "";
    return on ? "info" : "";
  }
  function conditionChips(conds) {
    return h(
      "div",
      { class: "chips", "data-conditions": "" },
      (conds || []).map((c) =>
        h("span", {
          class: `chip ${conditionClass(c)}`,
          "data-condition": c.type,
          "data-status": c.status,
          title: `${c.reason || ""}${c.message ? ": " + c.message : ""}`,
        }, `${c.type}: ${c.status}`),
      ),
    );
  }
  function panel(title, cls, ...children) {
    return h("div", { class: `panel ${cls || ""}` }, h("h3", {}, title), children);
  }
  function poolNames(dep) {
    const names = new Set(Object.keys(dep.pools || {}));
    for (const snap of dep.history || []) {
      for (const k of Object.keys(snap.replicas || {})) names.add(k);
      for (const k of Object.keys(snap.desired || {})) names.add(k);
    }
    return poolOrder([...names]);
  }
  function last(dep) {
    const hs = dep.history || [];
    return hs.length ? hs[hs.length - 1] : null;
  }

  function ratioPanel(dep, pools, axis) {
    const snap = last(dep);
    const ratioPools = pools.filter((p) => p !== "prefill" && p !== "colocated");
    const series = pools.includes("prefill")
      ? ratioPools.map((p, i) => ({
          label: `${p} / prefill`, color: poolColor(p, i), step: true,
          points: (dep.history || []).map((sn) => {
            const base = (sn.desired && sn.desired.prefill) || (sn.replicas && sn.replicas.prefill);
            const v = (sn.desired && sn.desired[p] !== undefined ? sn.desired[p] : sn.replicas && sn.replicas[p]);
            return [sn.t, base > 0 && isNum(v) ? v / base : null];
          }),
        }))
      : [];
    const order = pools.filter((p) => p !== "colocated");
    const labelOrder = ["prefill", "decode", "encoder"].filter((p) => order.includes(p));
    const what = labelOrder.length ? labelOrder.map((p) => p[0].toUpperCase()).join(":") : "replicas";
    const gpus = snap && isNum(snap.gpus) ? `${fmtNum(snap.gpus, 0)} GPUs` : "";
    const budget = snap && isNum(snap.gpu_budget) ? ` of ${fmtNum(snap.gpu_budget, 0)} budget` : "";
    return panel(
      `Ratio ${what}`,
      "ratio-panel",
      h("div", { class: "big", "data-ratio": dep.ratio || "" }, dep.ratio || "–"),
      h("div", { class: "sub", "data-gpus": snap && isNum(snap.gpus) ? snap.gpus : "" }, gpus + budget),
      series.length ? [lineChart({ series, width: 340, height: 90, timeAxis: axis, id: "ratio", title: "ratio over time" }), legend(series)] : null,
    );
  }

  function poolsPanel(dep, pools) {
    const rows = pools.map((p, i) => {
      const cur = (dep.pools || {})[p] || {};
      const drains = (cur.draining || []).length;
      return h(
        "tr",
        { "data-pool-row": p },
        h("td", {}, h("span", { class: "swatch", style: `background:${poolColor(p, i)}` }), p),
        h("td", { class: "num-main" }, h("span", { "data-pool": p, "data-field": "replicas" }, isNum(cur.replicas) ? String(cur.replicas) : "–")),
        h("td", { "data-field": "desired" }, isNum(cur.desired) ? String(cur.desired) : "–"),
        h("td", { "data-field": "ready" }, isNum(cur.ready) ? String(cur.ready) : "–"),
        h("td", { "data-field": "draining" }, String(drains)),
      );
    });
    return panel(
      "Pools",
      "pools-panel",
      h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "pool"), h("th", {}, "replicas"), h("th", {}, "desired"), h("th", {}, "ready"), h("th", {}, "draining"))),
        h("tbody", {}, rows)),
    );
  }

  function sizesPanel(dep, pools, axis) {
    const series = [];
    pools.forEach((p, i) => {
      const hist = dep.history || [];
      series.push({ label: `${p} desired`, color: poolColor(p, i), dashed: true, step: true, points: hist.map((sn) => [sn.t, (sn.desired || {})[p]]) });
      series.push({ label: `${p} actual`, color: poolColor(p, i), step: true, points: hist.map((sn) => [sn.t, (sn.replicas || {})[p]]) });
    });
    return panel(
      "Pool sizes over time",
      "wide sizes-panel",
      lineChart({ series, integer: true, height: 190, timeAxis: axis, id: "sizes", title: "pool sizes over time", format: (v) => fmtNum(v, 0) }),
      legend(series),
    );
  }

  function arrivalPanel(dep, axis) {
    const snap = last(dep);
    const pts = (dep.history || []).map((sn) => [sn.t, sn.arrival_rps]);
    return panel(
      "Arrival rate",
      "arrival-panel",
      h("div", { class: "big", "data-arrival": snap && isNum(snap.arrival_rps) ? snap.arrival_rps : "" },
        snap && isNum(snap.arrival_rps) ? fmtNum(snap.arrival_rps) : "–", h("span", { class: "unit" }, "req/s")),
      lineChart({ series: [{ label: "arrival", color: "#4a5568", points: pts }], width: 340, height: 110, timeAxis: axis, id: "arrival", title: "arrival rate" }),
    );
  }

  // The last plan's stages: sized for the planned rate (the observed one, forecast one lead time
  // ahead, plus counting noise, backlog and headroom) at the planned replicas, not the pools as
  // they run: lambda here is above the arrival rate panel's whenever the plan keeps spare capacity.
  function stagesPanel(dep) {
    const snap = last(dep);
    const stages = (snap && snap.stages) || {};
    const names = Object.keys(stages);
    const title = "Stages as planned: L = λ × W";
    if (!names.length) return panel(title, "stages-panel", h("div", { class: "nodata" }, "no per-stage metrics yet"));
    const planned = snap && isNum(snap.planned_rps) ? snap.planned_rps : null;
    const observed = snap && isNum(snap.arrival_rps) ? snap.arrival_rps : null;
    const basis = planned === null
      ? "the last plan, at its replicas"
      : `planned for ${fmtNum(planned)} req/s` +
        (observed === null ? "" : ` (observed ${fmtNum(observed)}; forecast, noise, backlog and headroom)`) +
        ", at the planned replicas";
    return panel(
      title,
      "stages-panel",
      h("div", { class: "sub", "data-planned-rps": planned === null ? "" : planned }, basis),
      h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "stage"), h("th", {}, "λ planned (req/s)"), h("th", {}, "W"), h("th", {}, "L"), h("th", {}, "util"))),
        h("tbody", {}, names.map((n) => {
          const st = stages[n] || {};
          return h("tr", { "data-stage": n },
            h("td", {}, n),
            h("td", {}, fmtNum(st.lambda)),
            h("td", {}, fmtSec(st.W)),
            h("td", {}, fmtNum(st.L)),
            h("td", {}, isNum(st.utilization) ? fmtNum(st.utilization * 100, 0) + " %" : "–"));
        }))),
    );
  }

  function latencyPanel(dep, axis) {
    const snap = last(dep);
    const slo = (snap && snap.slo) || dep.slo || {};
    const pred = (snap && snap.predicted) || {};
    const obs = (snap && snap.observed) || {};
    const verdict = (v, lim) => {
      if (!isNum(v) || !isNum(lim)) return "";
      return v <= lim ? h("span", { class: "ok" }, " ✓") : h("span", { class: "over" }, " ✗");
    };
    const row = (label, key) =>
      h("tr", { "data-latency": key },
        h("td", {}, label),
        h("td", {}, fmtSec(pred[key]), verdict(pred[key], slo[key])),
        h("td", {}, fmtSec(obs[key]), verdict(obs[key], slo[key])),
        h("td", {}, fmtSec(slo[key])));
    const chart = (key, title) => {
      const hist = dep.history || [];
      const series = [
        { label: "predicted", color: "#6b46c1", dashed: true, points: hist.map((sn) => [sn.t, (sn.predicted || {})[key]]) },
        { label: "observed", color: "#2b6cb0", points: hist.map((sn) => [sn.t, (sn.observed || {})[key]]) },
      ];
      return lineChart({ series, hlines: [{ y: slo[key], label: "SLO" }], height: 100, timeAxis: axis, id: `latency-${key}`, title, format: fmtSec });
    };
    const hasSeries = (dep.history || []).some((sn) =>
      ["ttft_s", "itl_s"].some((k) => isNum((sn.predicted || {})[k]) || isNum((sn.observed || {})[k])));
    return panel(
      "Latency vs SLO",
      "wide latency-panel",
      h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "predicted"), h("th", {}, "observed"), h("th", {}, "SLO"))),
        h("tbody", {}, row("TTFT", "ttft_s"), row("ITL", "itl_s"))),
      hasSeries
        ? [h("div", { class: "sub" }, "TTFT"), chart("ttft_s", "TTFT over time"), h("div", { class: "sub" }, "ITL"), chart("itl_s", "ITL over time"),
           legend([{ label: "predicted", color: "#6b46c1", dashed: true }, { label: "observed", color: "#2b6cb0" }, { label: "SLO", color: "#c62828", dashed: true }])]
        : h("div", { class: "nodata" }, "no latency series yet"),
    );
  }

  function drainsPanel(dep, pools) {
    const items = pools.filter((p) => ((dep.pools || {})[p] || {}).draining && dep.pools[p].draining.length);
    return panel(
      "Drains in progress",
      "drains-panel",
      items.length
        ? items.map((p) => h("div", { "data-drain-pool": p }, h("strong", {}, p), h("ul", { class: "pods" }, dep.pools[p].draining.map((pod) => h("li", { "data-drain-pod": pod }, pod)))))
        : h("div", { class: "nodata", "data-drains": "0" }, "none"),
    );
  }

  // A {pool: replicas} map as "prefill 2 · decode 4", in pipeline order.
  function fmtPools(m, pools) {
    const names = Object.keys(m || {});
    if (!names.length) return "";
    const order = pools.filter((p) => names.includes(p)).concat(names.filter((p) => !pools.includes(p)));
    return order.map((p) => `${p} ${m[p]}`).join(" · ");
  }

  function decisionsPanel(dep, axis, pools) {
    const decs = (dep.decisions || []).slice(-12).reverse();
    const same = (a, b) => fmtPools(a, pools) === fmtPools(b, pools);
    return panel(
      "Recent decisions",
      "wide decisions-panel",
      decs.length
        ? h("div", { class: "table-scroll" },
            h("table", { class: "decisions" },
              h("thead", {}, h("tr", {}, h("th", {}, "time"), h("th", {}, "reason"), h("th", {}, "targets"),
                h("th", {}, "next step"), h("th", {}, "planned"), h("th", {}, "notes"))),
              h("tbody", {}, decs.map((d) => h("tr", { "data-decision": d.reason || "" },
                h("td", { class: "time" }, fmtTime(d.time, axis)),
                h("td", { class: "reason" }, d.reason || ""),
                h("td", { class: "pools", "data-targets": "" }, fmtPools(d.targets, pools)),
                h("td", { class: "pools" }, same(d.next_step, d.targets) ? "" : fmtPools(d.next_step, pools)),
                h("td", { class: "pools" }, fmtPools(d.planned, pools)),
                h("td", { class: "msg" }, d.message || ""))))))
        : h("div", { class: "nodata" }, "no decisions recorded"),
    );
  }

  function summaryPanel(dep) {
    const entries = Object.entries(dep.summary || {});
    if (!entries.length) return null;
    return panel(
      "Summary",
      "wide summary-panel",
      h("table", {}, h("tbody", {}, entries.slice(0, 60).map(([k, v]) =>
        h("tr", { "data-summary": k }, h("td", {}, k), h("td", {}, typeof v === "number" ? fmtNum(v, Math.abs(v) < 1 ? 4 : 2) : String(v)))))),
    );
  }

  function renderCard(dep, axis) {
    const key = `${dep.namespace}/${dep.name}`;
    const pools = poolNames(dep);
    const hasHistory = (dep.history || []).length > 0;
    return h(
      "section",
      { class: "card", "data-deployment": key },
      h("div", { class: "card-head" },
        h("h2", {}, dep.name, h("small", {}, dep.namespace)),
        conditionChips(dep.conditions)),
      h("div", { class: "grid" },
        hasHistory ? [
          ratioPanel(dep, pools, axis),
          poolsPanel(dep, pools),
          arrivalPanel(dep, axis),
          sizesPanel(dep, pools, axis),
          stagesPanel(dep),
          drainsPanel(dep, pools),
          latencyPanel(dep, axis),
          decisionsPanel(dep, axis, pools),
        ] : null,
        summaryPanel(dep)),
    );
  }

  // -- refresh loop ----------------------------------------------------------------
  function render(doc) {
    const main = document.getElementById("deployments");
    const deps = doc.deployments || [];
    const axis = doc.time_axis || "unix";
    const seen = new Set();
    let prevEl = null;
    for (const dep of deps) {
      const key = `${dep.namespace}/${dep.name}`;
      seen.add(key);
      const card = renderCard(dep, axis);
      const old = main.querySelector(`:scope > [data-deployment="${CSS.escape(key)}"]`);
      if (old) old.replaceWith(card);
      else if (prevEl) prevEl.after(card);
      else main.prepend(card);
      prevEl = card;
    }
    for (const el of Array.from(main.children)) {
      if (!seen.has(el.getAttribute("data-deployment"))) el.remove();
    }
    document.getElementById("empty").hidden = deps.length > 0;
    document.getElementById("source").textContent = doc.source ? `source: ${doc.source}` : "";
    const err = document.getElementById("error");
    err.hidden = !doc.error;
    err.textContent = doc.error || "";
  }

  async function tick() {
    const status = document.getElementById("status");
    try {
      const resp = await fetch("api/state", { cache: "no-store", headers: { Accept: "application/json" } });
      const doc = await resp.json();
      render(doc);
      state.updates += 1;
      state.last = doc;
      document.body.setAttribute("data-updates", String(state.updates));
      status.dataset.state = "ok";
      status.textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}` + (refresh > 0 ? ` · every ${refresh} s` : "");
    } catch (e) {
      status.dataset.state = "error";
      status.textContent = `update failed: ${e.message || e}`;
    }
    if (refresh > 0) window.setTimeout(tick, refresh * 1000);
  }

  tick();
})();
