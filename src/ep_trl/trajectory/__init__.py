"""A turn's tokens and images, and the episode they make: the token-exact trajectory (``tokens``), the chat template
that renders each turn (``template``), one turn's exchange with a backend (``sampling``), what an episode is whichever
source plays it (``episode``), message content (``content``), the images of a sample (``sample_images``), a vision
model's inputs (``vision_inputs``), and the type aliases every layer shares (``types``). Import each from its module
(``from ep_trl.trajectory.template import ChatTemplate``)."""
