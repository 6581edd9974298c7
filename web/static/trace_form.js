// The trace form: rows added and removed in place, each row's netns/dev choices from the chosen node's
// registration (ListAgents), and the dispatcher's FieldErrors placed next to their fields while typing.
(() => {
  const form = document.getElementById("trace-form");
  if (!form) return;
  const agents = JSON.parse(document.getElementById("agents-data").textContent);
  const byNode = Object.fromEntries(agents.map((a) => [a.node, a]));
  const tbody = document.querySelector("#hops tbody");
  const template = document.getElementById("hop-row-template");
  const token = document.querySelector('meta[name="csrf-token"]').content;

  function fillOptions(datalist, values) {
    datalist.replaceChildren(
      ...values.map(([value, label]) => {
        const option = document.createElement("option");
        option.value = value;
        option.textContent = label;
        return option;
      }),
    );
  }

  function refreshChoices(row) {
    const agent = byNode[row.querySelector("select.node").value];
    const netns = row.querySelector("input.netns");
    const dev = row.querySelector("input.dev");
    const namespaces = agent ? agent.namespaces : [];
    // A namespace is offered by its name and by the containers and pods in it (container:NAME, pod:NS/NAME).
    fillOptions(
      netns.list,
      namespaces.flatMap((ns) => [
        [ns.name, ns.name || "(own namespace)"],
        ...(ns.aliases || []).map((alias) => [alias, ns.name || "(own namespace)"]),
      ]),
    );
    const ns = namespaces.find((n) => n.name === netns.value || (n.aliases || []).includes(netns.value));
    fillOptions(dev.list, ns ? ns.devices.map((d) => [d.name, `${d.kind}, mtu ${d.mtu}`]) : []);
  }

  function wireRow(row) {
    row.querySelector("select.node").addEventListener("change", () => refreshChoices(row));
    row.querySelector("input.netns").addEventListener("input", () => refreshChoices(row));
    row.querySelector("button.remove").addEventListener("click", (event) => {
      event.preventDefault();
      row.remove();
      scheduleValidation();
    });
    refreshChoices(row);
  }

  function addRow() {
    const rows = [...tbody.querySelectorAll("tr.hop")].map((r) => Number(r.dataset.row));
    const next = rows.length ? Math.max(...rows) + 1 : 0;
    const html = template.innerHTML.replaceAll("__N__", String(next));
    tbody.insertAdjacentHTML("beforeend", html);
    const row = tbody.lastElementChild;
    wireRow(row);
    return row;
  }

  tbody.querySelectorAll("tr.hop").forEach(wireRow);
  document.getElementById("add-hop").addEventListener("click", (event) => {
    event.preventDefault();
    addRow().querySelector("input").focus();
  });

  // Inline validation: the dispatcher's ValidateTrace errors, shown under the field they name.
  let timer = null;
  let sequence = 0;
  const validity = document.getElementById("validity");
  const general = document.getElementById("general-errors");

  function showErrors(result) {
    form.querySelectorAll(".field-error").forEach((span) => (span.textContent = ""));
    const leftover = [...(result.general || [])];
    for (const error of result.errors || []) {
      const span = error.input && document.getElementById(`err-${error.input}`);
      if (span) span.textContent = span.textContent ? `${span.textContent}; ${error.reason}` : error.reason;
      else leftover.push(`${error.field}: ${error.reason}`);
    }
    general.replaceChildren(
      ...leftover.map((text) => {
        const li = document.createElement("li");
        li.textContent = text;
        return li;
      }),
    );
    general.hidden = leftover.length === 0;
    validity.textContent = result.valid ? "✓ valid (checked by the dispatcher)" : "";
  }

  async function validate() {
    const mine = ++sequence;
    const body = new FormData(form);
    body.delete("action");
    try {
      const response = await fetch(form.dataset.validateUrl, {
        method: "POST",
        body,
        headers: { "X-CSRF-Token": token, Accept: "application/json" },
        credentials: "same-origin",
      });
      const result = await response.json();
      if (mine === sequence) showErrors(result);
    } catch (error) {
      if (mine === sequence) validity.textContent = `validation unavailable: ${error}`;
    }
  }

  function scheduleValidation() {
    clearTimeout(timer);
    timer = setTimeout(validate, 400);
  }

  form.addEventListener("input", scheduleValidation);
  form.addEventListener("change", scheduleValidation);

  // Discovery from the filter: the dispatcher's progress streamed as JSON lines, then the path graph (drawn
  // by the server) and, for each path, "apply as trace" (fills the hop rows and applies them).
  const discover = document.getElementById("discover");
  const discoverButton = document.getElementById("discover-button");
  const progress = document.getElementById("discover-progress");
  const discoverMessage = document.getElementById("discover-message");
  const graphBox = document.getElementById("path-graph");

  function fillRows(hops) {
    tbody.replaceChildren();
    for (const hop of hops) {
      const row = addRow();
      for (const [key, value] of Object.entries(hop)) {
        const input = row.querySelector(`[name$="-${key}"]`);
        if (input) input.value = value;
      }
      refreshChoices(row);
    }
    addRow();  // one blank row to fill in, as the server renders it
  }

  function wireGraph() {
    const dataNode = graphBox.querySelector("script.pathgraph-data");
    if (!dataNode) return;
    const graph = JSON.parse(dataNode.textContent);
    graphBox.querySelectorAll("button.apply-path").forEach((button) => {
      button.hidden = false;  // hidden without script: applying a path fills the rows in the page
      button.addEventListener("click", () => {
        const path = graph.paths[Number(button.dataset.path) - 1];
        fillRows(path.hops);
        const name = document.getElementById("name");
        if (!name.value) name.value = graphBox.dataset.name || "discovered";
        form.requestSubmit(document.getElementById("apply"));
      });
    });
  }

  function say(element, text) {
    element.textContent = text;
    element.hidden = !text;
  }

  async function runDiscovery() {
    const body = new FormData(form);
    body.set("action", "discover");
    discoverButton.disabled = true;
    say(discoverMessage, "");
    say(progress, "starting discovery…");
    graphBox.hidden = true;
    discover.dataset.state = "running";
    try {
      const response = await fetch(discover.dataset.streamUrl, {
        method: "POST", body, headers: { "X-CSRF-Token": token }, credentials: "same-origin",
      });
      if (!response.ok) {
        const result = await response.json().catch(() => ({ general: [response.statusText] }));
        showErrors(result);
        say(progress, "");
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (value) buffer += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline);
          buffer = buffer.slice(newline + 1);
          if (line.trim()) handle(JSON.parse(line));
        }
        if (done) break;
      }
    } catch (error) {
      say(discoverMessage, `discovery failed: ${error.message || error}`);
    } finally {
      discoverButton.disabled = false;
      discover.dataset.state = "done";
    }
  }

  function handle(event) {
    if (event.progress) {
      const p = event.progress;
      say(progress, `${p.message}${p.nodes_pending ? ` (${p.nodes_pending} node(s) still looking)` : ""}`);
    } else if (event.error) {
      if (event.errors) showErrors({ errors: event.errors, general: [] });
      say(discoverMessage, event.error);
      say(progress, "");
    } else if (event.result) {
      const r = event.result;
      if (!r.graph_html) {
        say(discoverMessage, r.message);
        say(progress, "");
        return;
      }
      graphBox.innerHTML = r.graph_html;  // markup the server rendered, values escaped there
      graphBox.dataset.name = r.name;
      graphBox.hidden = false;
      wireGraph();
      fillRows(r.graph.paths[0].hops);
      say(progress, `found ${r.graph.paths.length} path(s) from ${r.packets} packets on ${r.nodes.join(", ")}; ` +
        "the most common one fills the hops below");
    }
  }

  if (discover && discoverButton) {
    discoverButton.addEventListener("click", (event) => {
      event.preventDefault();
      runDiscovery();
    });
    wireGraph();
  }
})();
