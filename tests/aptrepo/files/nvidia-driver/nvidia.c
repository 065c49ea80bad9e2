// SPDX-License-Identifier: GPL-2.0
// kubegpu.node test stand-in for NVIDIA's nvidia kernel module: DKMS really builds it against the Debian kernel
// headers in the test container, and `modinfo` reports the version of the stand-in package. It drives nothing and
// refuses to load.
#include <linux/module.h>
#include <linux/errno.h>

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kubegpu.node test stand-in for the nvidia module (drives nothing)");
MODULE_VERSION(NVIDIA_STANDIN_VERSION);

static int __init nvidia_standin_init(void)
{
	return -ENODEV;
}
module_init(nvidia_standin_init);
