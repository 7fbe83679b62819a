// ConvNN Explorer's multi-hop view (app_components.HopsView): the receptive field of the query, drawn in the page.
//
// The body of the component's js_on_load(element, trigger, props, server, upload, watch), after web/panel.js. The
// server sends, per (model, image, layer, hops, head), the first hop reaching each model-input pixel for every query
// cell of the layer (analysis/rendering/page.py: page_hops). The view draws the field of the query its boxes hold
// (its root's data-query-boxes: panel.js's readQuery), and redraws when it changes there: a click only looks the query's row
// up. Where every query's field would be too large a table (a large layer on a large input), the server sends the
// fields of the queries listed in `queries`, and for a query not among them this view asks for its field (its named
// event "field"), which comes back as its value.

const MAX_PX = 420; // the panel's largest CSS width
const ASK_AGAIN_MS = 100; // after an answer for another query than the one asked for last, ask again this late

const root = element.querySelector(".cx-hops");
root.innerHTML = `<canvas class="cx-hop-canvas" aria-label="receptive field of the query"></canvas>
  <div class="cx-legend"></div><div class="cx-counts"></div>`;
const canvas = root.querySelector("canvas");
const boxes = root.dataset.queryBoxes.split(" "); // the elem_ids of the query's row and col boxes
const followed = new WeakSet(); // the boxes this view follows (panel.js: followQuery)
let field = null;
let drawCount = 0;
let asked = null; // the query cell whose field was asked for and has not arrived yet

function draw() {
  const query = field && readQuery(boxes);
  if (!query || query[0] >= field.input_size || query[1] >= field.input_size) return;
  const size = field.input_size;
  const cell = cellOf(field, query);
  const raster = cell[0] * field.width + cell[1];
  const row = rowOf(field, cell); // the query's row of the table
  if (row < 0) { // not in the table: ask the server for this query's field, once
    if (asked !== raster) {
      asked = raster;
      root.dataset.asked = String(raster);
      trigger("field", {index: [...query]});
    }
    return;
  }
  const css = Math.max(160, Math.min(MAX_PX, root.clientWidth || MAX_PX));
  const ratio = window.devicePixelRatio || 1;
  canvas.style.width = canvas.style.height = `${css}px`;
  canvas.width = canvas.height = Math.round(css * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.imageSmoothingEnabled = false;
  const scale = css / size;
  if (field.picture.complete) ctx.drawImage(field.picture, 0, 0, css, css);
  ctx.fillStyle = "rgba(0, 0, 0, 0.45)"; // what no hop reaches is dimmed
  ctx.fillRect(0, 0, css, css);
  const offset = row * size * size;
  for (let hop = field.colors.length - 1; hop >= 0; hop--) {
    ctx.fillStyle = field.colors[hop];
    ctx.globalAlpha = hop === 0 ? 0.9 : 0.55;
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        if (field.hops[offset + y * size + x] === hop) ctx.fillRect(x * scale, y * scale, scale, scale);
      }
    }
  }
  ctx.globalAlpha = 1;
  ctx.strokeStyle = "#fff";
  ctx.lineWidth = 2;
  ctx.strokeRect(query[1] * scale - 2, query[0] * scale - 2, scale + 4, scale + 4);
  const counts = field.pixel_counts.slice(row * field.colors.length, (row + 1) * field.colors.length);
  root.querySelector(".cx-legend").replaceChildren(...["query", ...field.layers].map((name, hop) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = field.colors[hop];
    item.append(swatch, `hop ${hop}: ${name}`);
    return item;
  }));
  root.querySelector(".cx-counts").textContent =
    `pixels reached from pixel (${query[0]}, ${query[1]}): ` +
    Array.from(counts, (n, hop) => `hop ${hop}: ${n} px`).join(", ");
  drawCount += 1;
  root.dataset.query = query.join(",");
  root.dataset.counts = Array.from(counts).join(",");
  root.dataset.drawn = String(drawCount);
}

function show() {
  const value = props.value;
  if (!value || typeof value !== "object" || !value.hops) return;
  const [height, width] = value.grid;
  field = {...value, height, width, hops: decode(value.hops, Int8Array),
           pixel_counts: decode(value.pixel_counts, Int32Array), picture: loadImage(value.image, () => draw())};
  if (asked !== null && field.queries && !field.queries.includes(asked)) {
    // the answer to an earlier click, while a later one's was asked for: Gradio dropped that trigger (it came while
    // this event was on its way), so ask again once this one has finished (`asked` holds the draw below back)
    setTimeout(() => { asked = null; draw(); }, ASK_AGAIN_MS);
  } else {
    asked = null;
  }
  followQuery(boxes, followed, draw);
  draw();
}

new ResizeObserver(() => draw()).observe(root);
watch("value", show);
show();
