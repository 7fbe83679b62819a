// ConvNN Explorer's in-page explorer (app_components.ExplorerView): the neighbour table of one (model, image, layer,
// rule knobs), drawn here with web/panel.js's functions.
//
// The body of the component's js_on_load(element, trigger, props, server, upload, watch), after web/panel.js. The
// server sends, once per table, every query cell's neighbours under every rule (analysis/rendering/page.py packs it)
// as this component's value; a click, a tap, a hover or an arrow key only looks rows up and redraws, so it never
// waits for the server. The page computes nothing the Python API answers: ranks, scores, distances, overlaps,
// contributions and shares are rows of the table. The query lives in the query row/col boxes (data-query-boxes:
// panel.js's readQuery/writeQuery): a click writes it there, and this view, like every other, redraws when it
// changes there (a click in compare mode, a typed row).
//
// The component's value is either a table (it has `rules`) or the α animation's frames for the table shown (it has
// `alphas`: analysis/rendering/page.py's page_sweep). Two named events ask the server for something: "row", for a
// K above the table's bound (the table then holds one query's row: a click on another cell asks for that row, the
// one case where a click waits), and "sweep", once per table when "▶ α" is pressed; each is answered with this
// component's value. A third, "view", tells the page that what it shows, as a link names it, changed (the page
// answers it in the page: app_texts.CLEAR_LINK_JS). The animation plays the frames on the focus panel, frame by frame, for the query shown (a
// click during the animation moves it), with the window share and the mean distance traced as curves.

const FOCUS_MAX_PX = 560; // the focus panel's largest CSS width
const FOCUS_HEADROOM_PX = 190; // of the window's height, left above and below the focus panel
const MULTIPLE_PX = 132; // each small multiple's CSS width
const SWEEP_FRAME_MS = 160; // each α of the animation is shown this long
const ASK_AGAIN_MS = 100; // after a row that answers an earlier click than the boxes' query, ask again this late
const VIEW_DATA = ["model", "image", "layer", "options", "draw", "query", "rule"]; // the drawn view, as a link names it

const root = element.querySelector(".cx");
root.innerHTML = `
  <div class="cx-head">
    <div class="cx-caption"></div>
    <div class="cx-rules" role="tablist" aria-label="selection rule shown large"></div>
    <button type="button" class="cx-play" title="blend α from 0 (the window: a convolution) to 1 (all tokens by feature similarity: attention)">▶ α: window → features</button>
  </div>
  <div class="cx-main">
    <div class="cx-focus">
      <canvas class="cx-canvas" tabindex="0" aria-label="the image at the model's resolution: click or tap a pixel"></canvas>
      <div class="cx-tip" role="status" hidden></div>
    </div>
    <div class="cx-side">
      <div class="cx-prediction" aria-label="prediction"></div>
      <div class="cx-known"></div>
      <div class="cx-seen"></div>
      <div class="cx-query"></div>
      <div class="cx-sweep" hidden><canvas class="cx-curve" aria-label="window share and mean distance against α"></canvas><div class="cx-sweep-text"></div></div>
      <table class="cx-stats"><thead></thead><tbody></tbody></table>
      <div class="cx-contrib"></div>
    </div>
  </div>
  <div class="cx-multiples"></div>
  <div class="cx-notes"></div>`;
const $ = (selector) => root.querySelector(selector);
const canvas = $(".cx-canvas");
const tip = $(".cx-tip");

const boxes = root.dataset.queryBoxes.split(" "); // the elem_ids of the query's row and col boxes
const followed = new WeakSet(); // the boxes this view follows (panel.js: followQuery)
let table = null; // the decoded table
let shownQuery = null; // [row_px, col_px] last drawn: what is shown while the boxes hold no pixel of this input
let focusRule = null;
let appliedHint = ""; // the rule a link or a lesson's step last named (a table's focus_rule, new at each opening)
let drawCount = 0;
let viewDrawn = ""; // VIEW_DATA's values last drawn
let sweep = null; // the decoded α sweep of the current table, once asked for
let sweepFrame = null; // the α frame shown, or null
let sweepTimer = null;
let playWhenSwept = false;

function currentQuery() { // the boxes' pixel where it is one of this table's input, else the one shown last
  const px = readQuery(boxes);
  return px && px[0] < table.input_size && px[1] < table.input_size ? px : shownQuery;
}

function selectionShown() { // the rule shown large, or the α frame the animation shows
  return sweepFrame === null ? table.byName[focusRule] : sweep.frames[sweepFrame];
}

// -- the table's rows ------------------------------------------------------------------------------------------
function contribution(row, rank) {
  const layer = table.byName.layer;
  return table.contributions ? table.contributions[row * layer.k + rank] : null;
}

function jaccard(a, b, row) {
  if (a === b) return 1;
  const values = table.jaccard[`${a}|${b}`] || table.jaccard[`${b}|${a}`];
  return values ? values[row] : NaN;
}

function focusWidth() { // as wide as its column allows, and short enough to leave the page's header in view
  const available = $(".cx-focus").clientWidth || root.clientWidth || FOCUS_MAX_PX;
  const tall = window.innerHeight > 0 ? window.innerHeight - FOCUS_HEADROOM_PX : FOCUS_MAX_PX;
  return Math.max(160, Math.min(FOCUS_MAX_PX, available, Math.max(tall, 280)));
}

function draw() {
  if (!table) return;
  const query = currentQuery();
  shownQuery = query;
  const cell = cellOf(table, query);
  const row = rowOf(table, cell);
  const selection = selectionShown();
  const focus = drawPanel(canvas, table, query, focusWidth(), selection, row, {labels: true, lines: true});
  drawRules();
  drawSide(query, row);
  drawSweep(row);
  drawMultiples(query, row);
  drawCount += 1;
  root.dataset.query = query.join(",");
  root.dataset.cell = cell.join(",");
  root.dataset.rule = focusRule;
  root.dataset.layer = table.layer;
  root.dataset.image = table.image_sha256 || "";
  root.dataset.model = table.model;
  root.dataset.options = JSON.stringify(table.options); // the knob values this table was made with
  root.dataset.draw = table.draw === null || table.draw === undefined ? "" : String(table.draw);
  root.dataset.alpha = sweepFrame === null ? "" : String(sweep.alphas[sweepFrame]);
  root.dataset.neighbors = JSON.stringify(row < 0 ? null : neighbors(selection, row).map((n) => n.cell));
  root.dataset.ranks = focus.ranks;
  root.dataset.drawn = String(drawCount); // last, so that a watcher of this attribute sees everything drawn
  const view = JSON.stringify(VIEW_DATA.map((name) => root.dataset[name]));
  if (view !== viewDrawn) { viewDrawn = view; trigger("view"); }
}

function drawRules() {
  const bar = $(".cx-rules");
  if (bar.dataset.for !== table.layer + table.rules.map((r) => r.name).join()) {
    bar.dataset.for = table.layer + table.rules.map((r) => r.name).join();
    bar.replaceChildren(...table.rules.map((rule) => {
      const button = document.createElement("button");
      button.type = "button";
      button.setAttribute("role", "tab");
      button.dataset.rule = rule.name;
      button.textContent = rule.title;
      button.addEventListener("click", () => { stopSweep(); focusRule = rule.name; draw(); });
      return button;
    }));
  }
  for (const button of bar.children) {
    button.setAttribute("aria-selected", String(button.dataset.rule === focusRule));
  }
}

function classBar(name, fraction, text) { // one class's bar: its name, a bar of the fraction, the text
  const item = document.createElement("div");
  item.className = "cx-bar";
  const label = document.createElement("span");
  label.textContent = name;
  const bar = document.createElement("span");
  bar.className = "cx-bar-fill cx-bar-class";
  bar.style.width = `${100 * fraction}%`;
  const value = document.createElement("span");
  value.textContent = text;
  item.append(label, bar, value);
  return item;
}

function drawPrediction() {
  const box = $(".cx-prediction");
  const shown = `${table.image.src}${table.model}|${table.draw}`;
  if (box.dataset.for === shown) return; // the same image, model and draw
  box.dataset.for = shown;
  const best = table.prediction[0];
  const title = document.createElement("div");
  title.className = "cx-predicted";
  title.textContent = best ? `${best[0]} · ${(100 * best[1]).toFixed(1)}%` : "";
  if (table.draw !== null && table.draw !== undefined) title.textContent += ` (draw ${table.draw})`;
  const bars = table.prediction.map(([name, probability]) =>
    classBar(name, probability, `${(100 * probability).toFixed(1)}%`));
  box.replaceChildren(title, ...bars, ...drawSpread());
  $(".cx-known").textContent = `This model knows ${table.classes.length} classes: ${table.classes.join(", ")}; ` +
    "whatever the photo, it answers with one of them."; // its own element: on a phone after the controls (page.css)
}

// A random-candidate model's answer over its eval draws, beside the prediction of the draw shown: each class's
// share of top-1 and the range of the top class's probability (analysis.draw_spread); nothing for another model.
function drawSpread() {
  const spread = table.spread;
  if (!spread) return [];
  const box = document.createElement("div");
  box.className = "cx-spread";
  const head = document.createElement("div");
  head.textContent = `Top-1 over ${spread.draws} eval draws (each equally valid):`;
  const bars = spread.shares.map(([name, share]) =>
    classBar(name, share, `${Math.round(share * spread.draws)}/${spread.draws}`));
  const range = document.createElement("div");
  range.className = "cx-spread-range";
  const [low, high] = spread.top_probability;
  range.textContent = `${spread.top_class}: ${(100 * low).toFixed(1)}–${(100 * high).toFixed(1)}% over the draws.`;
  box.append(head, ...bars, range);
  box.dataset.shares = JSON.stringify(spread.shares); // for tests: what the page shows, as the server sent it
  return [box];
}

function drawSide(query, row) {
  drawPrediction();
  const cell = cellOf(table, query);
  const share = table.branchShare && row >= 0 ? table.branchShare[row] : null;
  const heads = table.heads.length; // a layer of several heads: the rules above read this head's keys
  $(".cx-caption").textContent = `${table.model} · ${table.label}` +
    (heads > 1 ? ` · head ${table.options.head} of ${heads} (0–${heads - 1})` : "");
  $(".cx-query").innerHTML = "";
  const line = document.createElement("div");
  line.textContent = `query pixel (${query[0]}, ${query[1]}) → cell (${cell[0]}, ${cell[1]}) of ` +
    `${table.height}×${table.width} · K = ${table.options.num_neighbors}, R = ${table.options.window_size}, ` +
    `r = ${table.options.num_candidates}`;
  $(".cx-query").append(line);
  const own = table.byName.layer;
  if (focusRule === "layer" && sweepFrame === null && own.k !== table.options.num_neighbors) {
    const hint = document.createElement("div");
    hint.className = "cx-hint";
    hint.textContent = `"what the layer used" keeps the layer's own K = ${own.k}: K, R, r, the seed and α set ` +
      "the other rules (switch the rule shown large above).";
    $(".cx-query").append(hint);
  }
  if (share !== null) {
    const mix = document.createElement("div");
    mix.className = "cx-share";
    mix.textContent = `λ = ${table.branch_ratio}: the ConvNN branch makes ${(100 * share).toFixed(1)}% of this ` +
      `cell's mix output, the conv branch ${(100 * (1 - share)).toFixed(1)}%`;
    $(".cx-query").append(mix);
  }
  const head = $(".cx-stats thead");
  head.innerHTML = "<tr><th>rule</th><th>mean dist. (cells)</th><th>in R×R</th><th></th></tr>";
  head.rows[0].cells[3].textContent = `Jaccard vs ${table.byName[focusRule].title}`;
  const body = $(".cx-stats tbody");
  body.replaceChildren(...table.rules.map((rule) => {
    const tr = document.createElement("tr");
    tr.dataset.rule = rule.name;
    if (rule.name === focusRule) tr.className = "cx-current";
    const values = row < 0 ? ["", "", ""] : [format(rule.meanDistance[row]), `${Math.round(100 * rule.windowShare[row])}%`,
                                            format(jaccard(focusRule, rule.name, row))];
    for (const text of [rule.title, ...values]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  }));
  drawNeighborList(row);
  const notes = $(".cx-notes");
  $(".cx-seen").textContent = `What the model sees: the ${table.input_size}×${table.input_size} px input` +
    (table.image_note ? ` (${table.image_note}).` : ".");
  notes.replaceChildren(...table.notes.map((text) => {
    const p = document.createElement("p");
    p.textContent = text;
    return p;
  }));
}

function drawNeighborList(row) { // every neighbour of the rule shown large, for a phone that cannot hover
  const box = $(".cx-contrib");
  box.replaceChildren();
  if (row < 0) return;
  const selection = selectionShown();
  const used = table.contributions ? neighbors(table.byName.layer, row) : [];
  const same = (a, b) => a && b && a[0] === b[0] && a[1] === b[1];
  const list = neighbors(selection, row).map((n) => {
    const layer = used.find((u) => u.cell === null ? n.cell === null : same(u.cell, n.cell));
    return {...n, contribution: layer ? contribution(row, layer.rank) : null};
  });
  const largest = Math.max(...list.map((n) => n.contribution || 0), 1e-30);
  const title = document.createElement("div");
  title.className = "cx-contrib-title";
  title.textContent = `the ${list.length} neighbours shown large: rank, cell, similarity, and the contribution ` +
    "‖W_t·v‖ to this cell's output of those the layer itself used";
  box.append(title);
  for (const n of list.slice(0, table.max_labelled_ranks)) {
    const item = document.createElement("div");
    item.className = "cx-bar";
    const label = document.createElement("span");
    label.textContent = `${n.rank}: ${n.cell ? `(${n.cell[0]}, ${n.cell[1]})` : "CLS"} ${format(n.score, 2)}`;
    const bar = document.createElement("span");
    bar.className = "cx-bar-fill";
    bar.style.width = `${(100 * (n.contribution || 0)) / largest}%`;
    bar.style.background = table.colors[n.rank];
    const value = document.createElement("span");
    value.textContent = n.contribution === null ? "—" : format(n.contribution, 3);
    item.append(label, bar, value);
    box.append(item);
  }
  if (list.length > table.max_labelled_ranks) {
    const more = document.createElement("div");
    more.textContent = `… ${list.length - table.max_labelled_ranks} more (hover a cell, or export the query)`;
    box.append(more);
  }
}

function drawMultiples(query, row) {
  const box = $(".cx-multiples");
  const panels = table.rules.filter((rule) => rule.name !== focusRule).map((rule) => ({
    title: rule.title, selection: rule, onclick: () => { stopSweep(); focusRule = rule.name; draw(); }}));
  table.heads.forEach((head, h) => panels.push({title: `what the layer used · head ${h}`, selection: head}));
  while (box.children.length > panels.length) box.lastChild.remove();
  while (box.children.length < panels.length) {
    const figure = document.createElement("figure");
    figure.append(document.createElement("canvas"), document.createElement("figcaption"));
    box.append(figure);
  }
  panels.forEach((panel, i) => {
    const figure = box.children[i];
    figure.lastChild.textContent = panel.title;
    figure.onclick = panel.onclick || null;
    figure.classList.toggle("cx-clickable", Boolean(panel.onclick));
    drawPanel(figure.firstChild, table, query, figure.clientWidth || MULTIPLE_PX, panel.selection, row,
              {labels: false, lines: false});
  });
}

// -- the α animation ----------------------------------------------------------------------------------------------
function sweepMatches(value) { // whether a sweep belongs to the table shown (its model, image, draw, layer, K, R,
  const o = table.options;    // head): frames asked for before a new image or model came were played over it
  return value && value.model === table.model && value.image_sha256 === table.image_sha256 &&
    value.draw === table.draw && value.layer === table.layer && value.k === o.num_neighbors &&
    value.options.window_size === o.window_size && value.options.head === o.head;
}

function loadSweep(value) {
  const n = table.height * table.width;
  const cells = decode(value.cells, Int16Array);
  const noScores = new Float32Array(n * value.k).fill(NaN);
  return {
    ...value,
    frames: value.alphas.map((_, a) => ({k: value.k, cells: cells.subarray(a * n * value.k * 2, (a + 1) * n * value.k * 2),
                                          scores: noScores, candidates: null})),
    meanDistance: decode(value.mean_distance, Float32Array),
    windowShare: decode(value.window_share, Float32Array),
  };
}

function stopSweep() {
  clearTimeout(sweepTimer);
  sweepTimer = null;
  sweepFrame = null;
  $(".cx-play").textContent = "▶ α: window → features";
}

function playSweep() {
  stopSweep();
  focusRule = "blend";
  $(".cx-play").textContent = "■ stop";
  const step = (frame) => {
    sweepFrame = frame;
    draw();
    if (frame + 1 < sweep.alphas.length) sweepTimer = setTimeout(() => step(frame + 1), SWEEP_FRAME_MS);
    else { sweepTimer = null; $(".cx-play").textContent = "▶ again"; root.dataset.sweepDone = String(drawCount); }
  };
  step(0);
}

function drawSweep(row) {
  const box = $(".cx-sweep");
  box.hidden = !sweep || row < 0;
  if (box.hidden) return;
  const n = table.height * table.width;
  const count = sweep.alphas.length;
  const shares = sweep.alphas.map((_, a) => sweep.windowShare[a * n + row]);
  const distances = sweep.alphas.map((_, a) => sweep.meanDistance[a * n + row]);
  const far = Math.max(...distances.filter(Number.isFinite), 1e-9);
  const curve = $(".cx-curve");
  const [w, h] = [Math.min(300, $(".cx-side").clientWidth || 300), 90];
  const ratio = window.devicePixelRatio || 1;
  curve.style.width = `${w}px`;
  curve.style.height = `${h}px`;
  curve.width = Math.round(w * ratio);
  curve.height = Math.round(h * ratio);
  const ctx = curve.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const x = (a) => 6 + (a / (count - 1)) * (w - 12);
  const y = (v) => h - 14 - v * (h - 24);
  for (const [values, color] of [[shares, table.colors[0]], [distances.map((d) => d / far), "#E69F00"]]) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    values.forEach((v, a) => (a ? ctx.lineTo(x(a), y(v)) : ctx.moveTo(x(a), y(v))));
    ctx.stroke();
  }
  if (sweepFrame !== null) {
    ctx.strokeStyle = "#888";
    ctx.beginPath();
    ctx.moveTo(x(sweepFrame), 4);
    ctx.lineTo(x(sweepFrame), h - 12);
    ctx.stroke();
  }
  ctx.fillStyle = "#888";
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText("α = 0 (window)", 4, h - 1);
  ctx.textAlign = "right";
  ctx.fillText("α = 1 (features)", w - 4, h - 1);
  const a = sweepFrame === null ? count - 1 : sweepFrame;
  const shown = sweepFrame === null ? "" : ` · the large panel shows α = ${sweep.alphas[a].toFixed(2)}, the ` +
    `statistics table the knob's α = ${format(table.options.blend_alpha)} (a rule button goes back to the knob's)`;
  $(".cx-sweep-text").textContent = `α = ${sweep.alphas[a].toFixed(2)}: ${Math.round(100 * shares[a])}% of the K ` +
    `inside the R×R window (dark line), mean distance ${format(distances[a])} cells (orange, up to ${format(far)})` +
    shown;
}

$(".cx-play").addEventListener("click", () => {
  if (!table) return;
  if (sweepTimer !== null) { stopSweep(); draw(); return; }
  if (sweep) { playSweep(); return; }
  playWhenSwept = true;
  $(".cx-play").textContent = "… computing the frames";
  trigger("sweep"); // the server answers with the frames as this component's value, once per table
});

function showSweep(value) { // the α frames the server sent, played if "▶ α" asked for them
  if (!table || !sweepMatches(value)) return;
  sweep = loadSweep(value);
  if (playWhenSwept) { playWhenSwept = false; playSweep(); }
}

// -- the user -----------------------------------------------------------------------------------------------------
function follow() { // the query changed in its boxes (a click here or in compare mode, a typed row): redraw here
  if (!table) return;
  // The boxes hold the pixel drawn, which a copied link names: a typed pixel outside this input is moved to the
  // nearest one of it, and a box left empty (or not a whole number) goes back to the pixel shown; writing the
  // boxes calls this again.
  const typed = typedQuery(boxes);
  const px = typed?.every(Number.isInteger) ? clampPixel(typed, table.input_size) : shownQuery;
  if (!samePixel(px, typed)) { writeQuery(boxes, px); return; }
  draw();
  if (rowOf(table, cellOf(table, px)) < 0) trigger("row", {index: px}); // a K above the table's bound
}

function position(event) {
  const box = canvas.getBoundingClientRect();
  return pixelAt(table, frame(table, box.width), event.clientX - box.left, event.clientY - box.top);
}

canvas.addEventListener("click", (event) => { // anywhere on the panel: its padding frame snaps to the image
  if (table) writeQuery(boxes, position(event));
  showTip(); // the cell under the pointer is now the query (rank 0)
});

function describe(cell) { // what hovering a cell says: rank, similarity and contribution if it is selected
  const row = rowOf(table, cellOf(table, currentQuery()));
  const same = (n) => samePixel(n.cell, cell);
  const hit = row < 0 ? null : neighbors(selectionShown(), row).find(same);
  let text = `cell (${cell[0]}, ${cell[1]})`;
  if (hit) {
    text = `rank ${hit.rank} · ${text} · similarity ${format(hit.score, 3)}`;
    const used = neighbors(table.byName.layer, row).find(same);
    if (used && table.contributions) text += ` · contribution ${format(contribution(row, used.rank), 3)}`;
  } else {
    text += " · not selected";
  }
  const outside = cell[0] < 0 || cell[1] < 0 || cell[0] >= table.height || cell[1] >= table.width;
  return outside ? `${text} · a padding cell` : text;
}

let pointer = null; // the last pointer position over the focus panel (client pixels), for the tooltip

function showTip() {
  const box = canvas.getBoundingClientRect();
  const cell = pointer && table && cellAt(table, frame(table, box.width), pointer[0] - box.left,
                                          pointer[1] - box.top);
  if (!cell) { tip.hidden = true; return; }
  tip.textContent = describe(cell);
  tip.hidden = false;
  tip.style.left = `${Math.max(0, Math.min(pointer[0] - box.left + 12, box.width - 200))}px`;
  tip.style.top = `${pointer[1] - box.top + 14}px`;
}

canvas.addEventListener("pointermove", (event) => {
  pointer = event.pointerType === "touch" ? null : [event.clientX, event.clientY];
  showTip();
});
canvas.addEventListener("pointerleave", () => { pointer = null; tip.hidden = true; });

canvas.addEventListener("keydown", (event) => { // arrows move the query by one cell of the layer
  const step = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[event.key];
  if (!step || !table) return;
  event.preventDefault();
  const cell = cellOf(table, currentQuery());
  const r = Math.min(Math.max(cell[0] + step[0], 0), table.height - 1);
  const c = Math.min(Math.max(cell[1] + step[1], 0), table.width - 1);
  const f = frame(table, 1);
  const y = table.row_edges_px[r + f.pad];
  const x = table.col_edges_px[c + f.pad];
  writeQuery(boxes, [Math.min(y, table.input_size - 1), Math.min(x, table.input_size - 1)]);
});

function showTable(value) {
  // A new table (a knob, a layer) keeps the query of the boxes; a new image or model, or a table of one query's
  // row, brings the server's (the same pixel, moved inside a smaller input), which the boxes then hold.
  const px = readQuery(boxes);
  const inside = px && px[0] < value.input_size && px[1] < value.input_size;
  const keep = inside && value.queries == null && value.keep_query;
  table = decodeTable(value, () => draw());
  // One query's row that answers an earlier click while the boxes have moved on (a second click, an arrow key):
  // Gradio dropped the later "row" trigger (it came while this one was on its way), so the boxes stay and their
  // row is asked for again once this answer has settled.
  const behind = inside && value.queries != null && rowOf(table, cellOf(table, px)) < 0;
  stopSweep();
  sweep = null;
  playWhenSwept = false;
  shownQuery = keep || behind ? px : value.query_px;
  const hint = value.focus_rule || "";
  if (hint && hint !== appliedHint && table.byName[hint.split("@")[0]]) { // a link's or a lesson step's rule
    appliedHint = hint;
    focusRule = hint.split("@")[0];
  }
  if (!table.byName[focusRule]) focusRule = table.rules[table.rules.length - 1].name;
  followQuery(boxes, followed, follow);
  if (!keep && !behind) writeQuery(boxes, value.query_px); // every view follows (this one draws there)
  draw();
  if (behind) setTimeout(follow, ASK_AGAIN_MS);
}

function show() { // this component's value: a table, or the α frames of the table shown
  const value = props.value;
  if (!value || typeof value !== "object") return;
  if (value.rules) showTable(value);
  else if (value.alphas) showSweep(value);
}

new ResizeObserver(() => draw()).observe($(".cx-focus")); // root has no box of its own on a phone (page.css)
watch("value", show);
show();
