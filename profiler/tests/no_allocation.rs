//! A training step's layer work allocates no large buffer once the first micro-batch has run:
//! tensors come from, and go back to, the thread's pool (`device::tensor`), and faer's GEMMs
//! keep their packing buffers. Counted by a global allocator that tallies allocations of at
//! least 4 KiB (small bookkeeping — a `Vec` of saved states, token ids — is not what this is
//! about).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use autopp_profiler::device::{Block, Embedding, Flow, Head, Layer, Rng, Tensor};

struct Counting;

static LARGE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= 4096 {
            LARGE.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= 4096 {
            LARGE.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Embedding, two blocks and the head, forward then backward-input then backward-weight of
/// each layer in reverse, on `micro_batches` micro-batches kept in flight together (as a
/// pipeline keeps them), weight gradients summed into f32 accumulators.
fn step(layers: &[Layer], grads: &mut [Layer], micro_batches: usize, seqs: usize, s: usize) {
    let t = seqs * s;
    let mut kept = Vec::new();
    for m in 0..micro_batches {
        let ids: Vec<u32> = (0..t).map(|i| ((i * 31 + m * 7) % 1024) as u32).collect();
        let mut flow = Flow::Tokens(ids.clone());
        let mut saved = Vec::new();
        for layer in layers {
            let targets = matches!(layer, Layer::Head(_)).then(|| ids.clone());
            let (out, sv) = layer.forward(flow, targets, seqs, s).unwrap();
            saved.push(sv);
            flow = out;
        }
        kept.push(saved);
    }
    for saved in kept {
        let mut grad = None;
        for ((layer, g), sv) in layers.iter().zip(grads.iter_mut()).zip(saved).rev() {
            let (dx, ws) = layer.backward_input(sv, grad, 1e-3).unwrap();
            layer.backward_weight(ws, g).unwrap();
            grad = dx;
        }
    }
}

#[test]
fn the_step_loop_allocates_no_large_buffer_after_the_first_step() {
    let mut rng = Rng::new(9);
    let (h, heads, f, v) = (128, 4, 512, 1024);
    let layers = vec![
        Layer::Embedding(Embedding::init(&mut rng, v, h, None)),
        Layer::Block(Box::new(Block::init(&mut rng, h, heads, f, 2, true, true))),
        Layer::Block(Box::new(Block::init(&mut rng, h, heads, f, 2, true, true))),
        Layer::Head(Head::init(&mut rng, h, v)),
    ];
    let mut grads: Vec<Layer> = layers.iter().map(Layer::zeros_like).collect();
    step(&layers, &mut grads, 3, 2, 64);
    let before = LARGE.load(Ordering::Relaxed);
    step(&layers, &mut grads, 3, 2, 64);
    step(&layers, &mut grads, 3, 2, 64);
    let during = LARGE.load(Ordering::Relaxed) - before;
    assert_eq!(
        during, 0,
        "{during} allocations of 4 KiB or more in two steps"
    );
    // a new tensor of a size the step made is a reused one too
    let before = LARGE.load(Ordering::Relaxed);
    drop(Tensor::zeros(128, 128));
    assert_eq!(LARGE.load(Ordering::Relaxed), before);
}
